"""`rlhf plan`: the per-rank memory of a run, printed (the job and its plan: rlhf/planner/; docs/scale.md)."""

from __future__ import annotations

from rlhf.cli.flags import add_flags, flag, memory_size, positive_int, refuse_extra

PLAN = (
    flag(
        "--model",
        required=True,
        help="a named shape (0.5b 1.5b 7b 13b 70b smollm2-135m m84), or a model directory / config.json",
    ),
    flag(
        "--preset",
        default="ppo_max",
        help="an rlhf train preset (its roles: a critic, separate or shared, or none), or sft | rm | dpo | simpo "
        "(rlhf dpo --dpo.loss simpo: no reference)",
    ),
    flag("--lora", action="store_true", help="train LoRA adapters (the reference: adapter off)"),
    flag("--lora-rank", type=positive_int, default=16),
    flag("--dtype", default="bfloat16", help="float32 | bfloat16 | bfloat16-pure"),
    flag("--strategy", default="fsdp2", help="none | ddp | fsdp2 (every role sharded per layer)"),
    flag("--nodes", type=positive_int, default=1),
    flag("--gpus", type=positive_int, default=8, help="GPUs (ranks) per node"),
    flag(
        "--gpu-memory", type=memory_size, default="80GB", help="memory of one GPU with its unit: 80GB, 24GiB"
    ),
    flag("--micro-batch", type=positive_int, default=2, help="rows per update forward/backward"),
    flag("--rollout-batch", type=positive_int, help="responses per rollout (default: the preset's)"),
    flag("--prompt-tokens", type=positive_int, default=512),
    flag("--response-tokens", type=positive_int, default=512),
    flag("--gradient-checkpointing", action="store_true"),
    flag("--offload", action="store_true", help="fsdp2: shards and AdamW state in CPU memory"),
    flag(
        "--overlap-critic",
        action="store_true",
        help="one process on a CPU: policy and critic steps side by side (runtime.overlap_critic)",
    ),
    flag("--rollout-gather", default="whole", help="fsdp2 sampling: whole | per_layer (dist.rollout_gather)"),
    flag("--json", action="store_true", help="print the plan as JSON"),
)


def add_parser(sub, description: str) -> None:
    add_flags(sub.add_parser("plan", help=description, description=description + " (docs/scale.md)"), PLAN)


def run_plan_command(args, rest, ctx) -> int:
    import json

    from rlhf.planner.job import plan_for
    from rlhf.planner.memory_plan import render

    refuse_extra(rest, "plan")
    result = plan_for(
        args.model,
        args.preset,
        nodes=args.nodes,
        gpus=args.gpus,
        gpu_memory=args.gpu_memory,
        rollout_batch=args.rollout_batch,
        lora=args.lora,
        lora_rank=args.lora_rank,
        dtype=args.dtype,
        strategy=args.strategy,
        micro_batch=args.micro_batch,
        prompt_tokens=args.prompt_tokens,
        response_tokens=args.response_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
        rollout_gather=args.rollout_gather,
        offload=args.offload,
        overlap_critic=args.overlap_critic,
    )
    print(json.dumps(result.as_json(), indent=2) if args.json else render(result))
    return 0
