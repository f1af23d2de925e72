"""What the data-parallel tests run, on each rank and in one process (tests.support.dist_cases).

Everything here is built from seeds inside the calling process (a spawned rank has no fixtures):
the trainer tests' tiny models (tests/support/train_fixtures.py) and a PPO run with every switch the
data-parallel update must get right.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import runtime_for
from rlhf.stages.prompt_files import ptx_sampler
from tests.support.train_testing import PROMPT_TEXTS, WORDS, metric_rows, rl_config, write_jsonl

# 10 rows in 2 minibatches of 5: ranks hold 3 and 2 rows (uneven tokens, 2 and 1 micro-batches of 2)
CRITIC_FREE = ("grpo", "rloo", "reinforce_pp")
DATA_PARALLEL_CASE = {
    "rollout": {"batch_size": 10, "max_new_tokens": 5},
    "train": {"iterations": 2, "ppo_epochs": 2, "minibatches": 2, "micro_batch_size": 2},
    "advantage": {"whiten": True},
    "reward": {"normalize": True, "clip": 5.0},
    "kl": {"adaptive": True, "beta": 0.1, "target": 1.0, "horizon": 100},
    "critic": {"pretrain_iterations": 1},
    "policy_optim": {"lr": 1e-3, "max_grad_norm": 0.05},  # the clip acts (needs the global norm)
    "critic_optim": {"lr": 1e-3, "max_grad_norm": 0.05},
}


def with_ptx(layers: list[dict], ptx_file: str | None) -> list[dict]:
    """The config layers with data.ptx naming the PPO-ptx file (data.ptx_batch_size applies only
    with it), or without data.ptx_batch_size when there is no file."""
    if ptx_file:
        return [layers[0], {"data": {"ptx": ptx_file, "ptx_batch_size": 3}}, *layers[1:]]
    stripped = []
    for layer in layers:
        data = {k: v for k, v in layer.get("data", {}).items() if k != "ptx_batch_size"}
        layer = {k: v for k, v in layer.items() if k != "data"}
        stripped.append({**layer, "data": data} if data else layer)
    return stripped


def each_case(run, cases: list[tuple]) -> list:
    """`run(*case)` for every case, in order (several cases in one spawned job)."""
    return [run(*case) for case in cases]


def each_call(calls: list[tuple]) -> list:
    """`fn(*args)` for every `(fn, *args)`, in order (several checks of their own in one spawned job)."""
    return [fn(*args) for fn, *args in calls]


def tiny_models(tok, num_layers: int = 1):
    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=num_layers, num_heads=2)
    with torch.no_grad():  # about half the responses end within 5 tokens (as in tests/rl)
        generator = torch.Generator().manual_seed(0)
        policy.lm_head.weight[tok.eos_token_id] = 0.4 * torch.randn(32, generator=generator)
    reward_model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=num_layers, num_heads=2), head_init_std=0.5
    )
    return policy, reward_model


def ptx_rows_file(directory: Path) -> str:
    rows = [
        {"prompt": " ".join(WORDS[i : i + 2]), "response": " ".join(WORDS[i + 2 : i + 5])} for i in range(6)
    ]
    return str(write_jsonl(Path(directory) / "ptx.jsonl", rows))


def trainer_of(
    config, run_dir: Path, *, resume: bool = False, ptx_file: str | None = None, num_layers: int = 1
) -> RLTrainer:
    """A trainer on fresh tiny models whose runtime follows the process group (local outside one)."""
    tok = word_tokenizer([" ".join(WORDS)])
    policy, reward_model = tiny_models(tok, num_layers)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    ptx = ptx_sampler(tok, ptx_file, config.data.ptx_batch_size, max_prompt_tokens=8) if ptx_file else None
    return RLTrainer(
        config,
        runtime_for(roles, config),
        [tok(text)["input_ids"] for text in PROMPT_TEXTS],
        ptx_batches=ptx,
        run_dir=run_dir,
        resume=resume,
        quiet=True,
    )


def whole_params(runtime, module) -> dict:
    """`module`'s whole parameters by name (fsdp2: gathered on every rank)."""
    with runtime.whole_model(module, every_rank=True) as plain:
        return {n: p.detach().clone() for n, p in plain.named_parameters()}


def ppo_run(run_dir: str, preset: str, layers: list[dict], ptx_file: str | None = None) -> dict:
    """Train a run; what every rank must agree on: its returned metrics, the final parameters,
    the sampled tokens of the last rollout, and the metrics rank 0 wrote."""
    case = DATA_PARALLEL_CASE
    if preset in CRITIC_FREE:  # critic settings are errors there
        case = {k: v for k, v in case.items() if k not in ("critic", "critic_optim")}
    config = rl_config(preset, *with_ptx([case, *layers], ptx_file), out=run_dir)
    trainer = trainer_of(config, Path(run_dir), ptx_file=ptx_file)
    last = trainer.train()
    roles = trainer.runtime.roles
    written = metric_rows(run_dir) if trainer.runtime.writer else None
    policy, critic = whole_params(trainer.runtime, roles.policy.learner.module), {}
    if roles.critic:
        critic = whole_params(trainer.runtime, roles.critic.model)
    return {
        "last": {k: v for k, v in last.items() if not k.startswith(("time/", "throughput/"))},
        "policy": policy,
        "critic": critic,
        "sharded": roles.policy.learner.sharded is not None,
        "offload_policies": offload_policies(roles.policy.learner.module),  # fsdp2: each unit's
        "replicated": roles.policy.learner.replicated is not None,  # ddp: DistributedDataParallel
        "tokens": trainer.buffer[-1].input_ids.clone(),
        "written": written,
    }


class LargestTensors(TorchDispatchMode):
    """The most elements of any tensor an op creates while active, per phase (`phase`): a rank's local
    tensors (a DTensor counts its local shard), so a whole-model buffer shows as its whole size."""

    def __init__(self, count_meta: bool = True) -> None:
        super().__init__()
        self.phase = "other"
        self.largest: dict[str, int] = {}
        self.count_meta = count_meta

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and (self.count_meta or not t.is_meta):
                n = t.to_local().numel() if isinstance(t, DTensor) else t.numel()
                self.largest[self.phase] = max(self.largest.get(self.phase, 0), n)
        return out

    def during(self, name: str, fn):
        """`fn` with every op it runs counted under the phase `name`."""

        def watched(*args, **kwargs):
            self.phase = name
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = "other"

        return watched


def sharding_accounting(run_dir: str) -> dict:
    """An fsdp2 PPO-max run (2 decoder layers per model) watched by LargestTensors: per role, the
    whole and this rank's parameter elements between uses and the AdamW moments' elements; per
    phase (rollout, forwards, optimizer steps), the largest tensor any op created."""
    case = DATA_PARALLEL_CASE
    config = rl_config(
        "ppo_max", case, {"dist": {"strategy": "fsdp2"}, "train": {"iterations": 1}}, out=run_dir
    )
    trainer = trainer_of(config, Path(run_dir), num_layers=2)
    r, run = trainer.runtime.roles, trainer.runtime
    watch = LargestTensors()

    phase = watch.during
    run.generate, run.map_rows, run.train = (
        phase("rollout", run.generate),
        phase("forwards", run.map_rows),
        phase("steps", run.train),
    )
    with watch:
        trainer.train()
    roles = {
        "policy": r.policy.learner.module,
        "critic": r.critic.learner.module,
        "reference": r.reference.own_module,
        "reward_model": r.reward_model.model,
    }
    out = {"largest": watch.largest}
    for name, module in roles.items():
        params = list(module.parameters())
        out[name] = {
            "whole": sum(p.numel() for p in params),
            "local": sum(p.to_local().numel() for p in params),
            "sharded": all(isinstance(p, DTensor) for p in params),
        }
    for name, learner in (("policy", r.policy.learner), ("critic", r.critic.learner)):
        moments = [
            v for state in learner.optimizer.adamw.state.values() for v in state.values() if v.dim() > 0
        ]
        out[name]["moments_local"] = sum(m.to_local().numel() for m in moments)
    return out


def save_tiny_models(directory: str) -> dict[str, str]:
    """The 2-layer tiny policy and reward model as directories `load_roles` reads."""
    tok = word_tokenizer([" ".join(WORDS)])
    policy, reward_model = tiny_models(tok, num_layers=2)
    paths = {"policy": str(Path(directory) / "policy"), "reward_model": str(Path(directory) / "rm")}
    for model, path in ((policy, paths["policy"]), (reward_model, paths["reward_model"])):
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return paths


def meta_loading_accounting(paths: dict[str, str]) -> dict:
    """Load the roles as `rlhf train` under fsdp2 does (rank 1 on the meta device), shard them from
    rank 0 under LargestTensors (meta tensors not counted: they hold no memory); each role's whole
    parameters after sharding, the largest tensor this rank created while loading and while
    sharding, and the largest single parameter of any role."""
    import torch.distributed as dist

    from rlhf.rl.roles.assemble import load_roles

    config = rl_config("ppo_max", {"dist": {"strategy": "fsdp2"}}, model={"policy": paths["policy"],
                       "reward_model": paths["reward_model"]})  # fmt: skip
    watch = LargestTensors(count_meta=False)
    with watch:
        watch.phase = "load"
        roles = load_roles(config, on_meta=dist.get_rank() != 0)
        watch.phase = "shard"
        runtime = runtime_for(roles, config)
        runtime.shard_roles()
    modules = {
        "policy": roles.policy.learner.module,
        "critic": roles.critic.learner.module,
        "reference": roles.reference.own_module,
        "reward_model": roles.reward_model.model,
    }
    whole = {}
    largest_parameter = max(p.numel() for m in modules.values() for p in m.parameters())
    for name, module in modules.items():
        whole[name] = whole_params(runtime, module)
    return {"largest": watch.largest, "largest_parameter": largest_parameter, "whole": whole}


def wait_for_a_silent_peer(seconds: float) -> tuple[bool, str] | None:
    """Rank 0 sums a tensor while rank 1 stays silent for `seconds` (longer than dist.timeout):
    rank 0's collective must fail (not hang) with an error `rlhf` reports as a lost peer."""
    import time

    import torch.distributed as dist

    from rlhf.parallel.process_group import is_lost_peer

    if dist.get_rank() == 1:
        time.sleep(seconds)
        return None
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as err:  # noqa: BLE001 (the error is the result)
        return is_lost_peer(err), str(err)
    return False, "the collective returned"


def write_supervised_data(directory: Path) -> dict[str, str]:
    """13 SFT rows and 13 preference pairs of 2 to 4 words (uneven lengths)."""
    sft, pairs = [], []
    for n in range(13):
        prompt = " ".join(WORDS[n : n + 1 + n % 3])
        sft.append({"prompt": prompt, "response": " ".join(WORDS[n % 7 : n % 7 + 1 + n % 4])})
        rejected = " ".join(WORDS[n % 5 : n % 5 + 2 + n % 3])
        pairs.append({"prompt": prompt, "chosen": "t " + WORDS[n % 9], "rejected": rejected})
    return {
        "sft": str(write_jsonl(Path(directory) / "sft.jsonl", sft)),
        "rm": str(write_jsonl(Path(directory) / "rm.jsonl", pairs)),
        "dpo": str(Path(directory) / "rm.jsonl"),  # the same pairs
    }


def supervised_stage(
    stage: str,
    run_dir: str,
    data_path: str,
    strategy: str = "ddp",
    num_layers: int = 1,
    batch_size: int = 5,
    model_dir: str | None = None,
    checkpoint: dict | None = None,
):
    """(the stage, its tiny model, tokenizer) of a 2-step SFT, reward-model or DPO run on 5 rows per
    step (ranks hold 3 and 2: uneven tokens, 2 and 1 micro-batches of 2; `batch_size` 1: rank 1 holds
    none), clipping on, evaluation every step. `model_dir`: the stage loads it (model and tokenizer
    None). Stage "dpo-live": the reference copy's log-probs in every step (not cached); "dpo-lora": a
    LoRA policy, its reference the adapter switched off, in every step; "sft-checkpointed": with
    gradient checkpointing; "-offload" (sft, dpo): under fsdp2 with dist.offload; "-budget": micro-
    batches by a token budget (`train.micro_batch_tokens`); "-compiled": `train.compile`. `checkpoint`: the
    DPO run's `checkpoint` settings."""
    from rlhf.config import DPOConfig, RewardConfig, SFTConfig, load_config
    from rlhf.stages.dpo import DPOStage
    from rlhf.stages.rm import RewardModelStage
    from rlhf.stages.sft import SFTStage

    tok = word_tokenizer([" ".join(WORDS)])
    policy, reward_model = tiny_models(tok, num_layers=num_layers)
    overrides = {
        "out": run_dir,
        "model": model_dir or "unused",
        "train": {
            "max_steps": 2,
            "batch_size": batch_size,
            "micro_batch_size": 2,
            "eval_every": 1,
            "log_every": 1,
        },
        "optim": {"lr": 1e-3, "max_grad_norm": 0.5, "warmup_steps": 0},
        "data": {"test_fraction": 0.3, "path": data_path},
        "sinks": ["jsonl"],
        "dist": {"strategy": strategy},
    }
    if model_dir is not None:
        policy = reward_model = tok = None
    if stage.endswith("-offload") and strategy == "fsdp2":  # CPUOffloadPolicy on every unit
        overrides["dist"]["offload"] = True
    if checkpoint is not None:
        overrides["checkpoint"] = checkpoint
    if stage.endswith("-budget"):  # micro-batches by a token budget under the longest row: each row
        overrides["train"]["micro_batch_tokens"] = 1  # alone, so ranks of 3 and 2 rows run 3 and 2
    if stage.endswith("-compiled"):  # train.compile: the training forwards compiled (aot_eager: quick)
        overrides["train"].update(compile=True, compile_backend="aot_eager")
    if stage == "sft-checkpointed":  # gradient checkpointing: each layer's forward run again in the backward
        overrides["gradient_checkpointing"] = True
    if stage.startswith("sft"):
        return SFTStage(load_config(SFTConfig, overrides=overrides)), policy, tok
    if stage == "dpo-live":
        overrides["dpo"] = {"precompute_reference": False}
    if stage == "dpo-lora":
        overrides.update(dpo={"precompute_reference": False}, lora={"enabled": True, "r": 4})
        overrides["optim"]["lr"] = 1e-2  # the adapters move the log-probs
    if stage == "dpo-simpo":  # reference-free: no copy built, sharded or scored
        overrides["dpo"] = {"loss": "simpo", "beta": 2.0, "simpo_gamma": 0.5}
    if stage.startswith("dpo"):  # "dpo": the reference a frozen copy; its log-probs cached, shares joined
        return DPOStage(load_config(DPOConfig, overrides=overrides)), policy, tok
    return RewardModelStage(load_config(RewardConfig, overrides=overrides)), reward_model, tok


def supervised_run(
    stage: str, run_dir: str, data_path: str, strategy: str = "ddp", batch_size: int = 5, model_dir=None
) -> dict:
    """`supervised_stage`'s run: its final metrics, parameters and (rank 0) written metrics and export;
    `model_dir`: loaded by the stage; `built_on_meta`: every parameter of the model it built (and of
    DPO's reference copy) on the meta device."""
    from safetensors.torch import load_file

    from rlhf.models.compiled import is_compiled_for_training
    from rlhf.parallel.fsdp import whole_copy
    from rlhf.parallel.peers import current_peers
    from rlhf.train.supervised import run_supervised

    stage_, model, tok = supervised_stage(stage, run_dir, data_path, strategy, batch_size=batch_size,
                                          model_dir=model_dir)  # fmt: skip
    built, build_model = [], stage_.build_model

    def watched_build(*args):
        built.append(build_model(*args))
        frozen = stage_.reference.model.parameters() if stage == "dpo" else ()
        built.append(all(p.is_meta for p in [*built[0].parameters(), *frozen]))
        return built[0]

    stage_.build_model = watched_build
    runs, train_step = [], stage_.train_step
    stage_.train_step = lambda run, rows: runs.append(run) or train_step(run, rows)
    final = run_supervised(stage_, model=model, tokenizer=tok, quiet=True)
    model = built[0]
    roots = [runs[0].learner.module]  # the sharded root (the model's ModelCall), and DPO's reference copy
    reference = getattr(stage_, "reference", None)  # DPO's (None: SimPO has none)
    roots += [stage_.reference_call] if reference is not None and reference.mode == "copy" else []
    peers = current_peers()
    sharded = all(isinstance(p, DTensor) for p in model.parameters())  # per layer: the model's every one
    with whole_copy(model, every_rank=True) as plain:  # fsdp2: the whole parameters, gathered on every rank
        params = {n: p.detach().clone() for n, p in plain.named_parameters()}
    writer = peers is None or peers.rank == 0
    return {
        "last": final,
        "params": params,
        "sharded": sharded,
        "exported": load_file(str(Path(run_dir) / "model.safetensors")) if writer else None,
        "written": metric_rows(run_dir, kinds=("step",)) if peers is None or peers.rank == 0 else None,
        "built_on_meta": built[1],
        "compiled": is_compiled_for_training(model),
        "offload_policies": [policy for root in roots for policy in offload_policies(root)],
    }


def offload_policies(root) -> list[str]:
    """The offload policy of every FSDP unit of the sharded `root` (torch's per-unit state), by class
    name: "CPUOffloadPolicy" under dist.offload, else "OffloadPolicy" (none); [] when not sharded."""
    from rlhf.parallel.fsdp import fsdp_units

    return [
        type(unit._get_fsdp_state()._fsdp_param_group.offload_policy).__name__ for unit in fsdp_units(root)
    ]


class Interrupted(Exception):
    pass


RESUME_CASE = {"train": {"iterations": 3}, "checkpoint": {"every": 1, "keep": 5}}


def run_whole_and_interrupted(root: str, ptx_file: str, strategy: str = "ddp") -> None:
    """Into root/whole an uninterrupted 3-iteration run; into root/split the same run stopped as it
    starts iteration 2 (its checkpoint iter_000002 written), then resumed to the end."""
    import shutil

    import torch.distributed as dist

    from rlhf.parallel.peers import current_peers

    layer = {"dist": {"strategy": strategy}}
    config = rl_config(
        "ppo_max", *with_ptx([DATA_PARALLEL_CASE, RESUME_CASE, layer], ptx_file), out=f"{root}/whole"
    )
    trainer_of(config, Path(root) / "whole", ptx_file=ptx_file).train()
    split = Path(root) / "split"
    config = rl_config(
        "ppo_max", *with_ptx([DATA_PARALLEL_CASE, RESUME_CASE, layer], ptx_file), out=str(split)
    )
    first = trainer_of(config, split, ptx_file=ptx_file)
    original = first.step

    def step():
        if first.iteration == 2:
            raise Interrupted
        return original()

    first.step = step
    try:
        first.train()
    except Interrupted:
        pass
    if dist.is_initialized():
        dist.barrier()  # rank 0 has written the checkpoint the others read
    if current_peers() is None or current_peers().rank == 0:
        shutil.copytree(split, Path(root) / "split_copy")  # for a resume at another world size
    trainer_of(config, split, resume=True, ptx_file=ptx_file).train()


DPO_RESUME = {"every": 1, "keep": 5}  # a checkpoint after step 1 of 2


def dpo_whole_and_interrupted(root: str, data_path: str) -> None:
    """Into root/whole an uninterrupted 2-step DPO run under fsdp2 (a checkpoint after step 1, each
    rank's shards); into root/split the same run stopped as step 2 starts, copied to root/split_copy
    (for a resume in one process), then resumed to the end here."""
    import shutil

    import torch.distributed as dist

    from rlhf.parallel.peers import current_peers
    from rlhf.train.supervised import run_supervised

    stage, model, tok = supervised_stage("dpo", f"{root}/whole", data_path, "fsdp2", checkpoint=DPO_RESUME)
    run_supervised(stage, model=model, tokenizer=tok, quiet=True)
    stage, model, tok = supervised_stage("dpo", f"{root}/split", data_path, "fsdp2", checkpoint=DPO_RESUME)
    steps, train_step = [], stage.train_step

    def step(run, rows):
        steps.append(None)
        if len(steps) == 2:
            raise Interrupted
        return train_step(run, rows)

    stage.train_step = step
    try:
        run_supervised(stage, model=model, tokenizer=tok, quiet=True)
    except Interrupted:
        pass
    dist.barrier()  # rank 0 has written DONE
    if current_peers().rank == 0:
        shutil.copytree(Path(root) / "split", Path(root) / "split_copy")
    dpo_resume(f"{root}/split", data_path)


def dpo_resume(run_dir: str, data_path: str) -> None:
    """`dpo_whole_and_interrupted`'s run in `run_dir` resumed (at any number of ranks, or in one process)."""
    from rlhf.train.supervised import run_supervised

    stage, model, tok = supervised_stage("dpo", run_dir, data_path, "fsdp2", checkpoint=DPO_RESUME)
    run_supervised(stage, model=model, tokenizer=tok, quiet=True, resume=True)


def resume_run(run_dir: str, ptx_file: str, strategy: str = "ddp") -> None:
    layers = with_ptx([DATA_PARALLEL_CASE, RESUME_CASE, {"dist": {"strategy": strategy}}], ptx_file)
    config = rl_config("ppo_max", *layers, out=run_dir)
    trainer_of(config, Path(run_dir), resume=True, ptx_file=ptx_file).train()


def threads_then_silent_peer(seconds: float) -> tuple[int, tuple[bool, str] | None]:
    """(this rank's torch threads inside the group, `wait_for_a_silent_peer(seconds)`)."""
    return torch.get_num_threads(), wait_for_a_silent_peer(seconds)


SAMPLING_CASES = {
    # 5 rows: shares of 3 and 2; rows end at different steps, most before max_new_tokens
    "plain": {"max_new_tokens": 12},
    # the paper's processing (repetition penalty, temperature, top-p) and a check every 3 steps
    "paper": {
        "max_new_tokens": 12,
        "temperature": 0.8,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "finished_check_every": 3,
    },
    # finished rows stay in the decoder's batch; the log-probs read from the sampler
    "keep-finished-rows": {"max_new_tokens": 12, "drop_finished_rows": False, "top_k": 5},
}


def sample_batches(case: str, batch_size: int = 5, batches: int = 3) -> list[dict]:
    """`batches` rollouts in a row from one generator, on this process's share of each batch's
    rows (every row outside a process group) joined over the ranks: their tokens, masks, log-probs
    and the decode steps this process ran itself (the generator must follow the longest share)."""
    from rlhf.models.sampling import RowShare, SamplingConfig, generate
    from rlhf.parallel.peers import current_peers
    from rlhf.parallel.rollout_share import join_rollouts, row_share

    tok = word_tokenizer([" ".join(WORDS)])
    policy, _ = tiny_models(tok)
    with torch.no_grad():  # more rows end early than in the PPO case (EOS early exit)
        policy.lm_head.weight[tok.eos_token_id] *= 2.0
    config = SamplingConfig(**SAMPLING_CASES[case])
    peers = current_peers()
    generator = torch.Generator().manual_seed(11)
    prompts = [tok(text)["input_ids"] for text in PROMPT_TEXTS]
    out = []
    for b in range(batches):
        from rlhf.data.collate import left_pad

        ids, mask = left_pad(prompts[b * 3 : b * 3 + batch_size], tok.pad_token_id)
        share = row_share(peers, batch_size) if peers is not None else RowShare(0, batch_size, batch_size)
        args = (config, tok.eos_token_id, tok.pad_token_id, generator, True)
        rows = slice(share.start, share.stop)
        mine = generate(policy, ids[rows], mask[rows], *args, share=share)
        local_steps = mine.decode_steps
        if peers is not None:
            mine = join_rollouts(peers, mine, share, generator, True, tok.pad_token_id)
        out.append(
            {
                "input_ids": mine.input_ids,
                "attention_mask": mine.attention_mask,
                "ended_with_eos": mine.ended_with_eos,
                "logprobs": mine.logprobs,
                "local_steps": local_steps,
                "steps": mine.decode_steps,
            }
        )
    return out


class ThreeLayers(torch.nn.Module):
    """`a`, `b`, `c`: what `partial_passes` uses of them differs by rank and pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = (torch.nn.Linear(3, 3) for _ in range(3))


def first_pass_loss(module: ThreeLayers, x: torch.Tensor, with_a: bool) -> torch.Tensor:
    h = module.a(x) if with_a else x
    return module.b(h).square().sum()


def last_pass_loss(module: ThreeLayers, x: torch.Tensor) -> torch.Tensor:
    return module.b(x).sin().sum()


PASS_INPUTS = [torch.linspace(-1, 1, 6).view(2, 3), torch.linspace(0.5, 2, 3).view(1, 3)]


def partial_passes() -> dict:
    """Under ddp (DistributedDataParallel, rlhf/parallel/replicated.py) two passes of one optimizer
    step: rank 0's first uses `a` and `b`, rank 1's `b` alone; the last (the reducing one) uses `b`
    alone on both; `c` is never used. The gradients before the step and the parameters after it."""
    from rlhf.config import OptimConfig
    from rlhf.parallel.parallel_plan import ParallelPlan
    from rlhf.parallel.peers import current_peers
    from rlhf.train.learner import Learner, Training
    from rlhf.train.supervised.model_call import ModelCall

    peers = current_peers()
    module = ThreeLayers()
    call = ModelCall(module)  # one call per loss, as the supervised stages' (train/supervised/model_call.py)
    learner = Learner.build(
        call, Training(OptimConfig(lr=0.1, weight_decay=0.5), 1, parallel=ParallelPlan(peers, "ddp"))
    )
    x = PASS_INPUTS[peers.rank]
    passes = learner.passes(2)
    with passes.next_pass():
        learner.train_forward(first_pass_loss, x, peers.rank == 0).backward()
    with passes.next_pass():
        learner.train_forward(last_pass_loss, x).backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}
    learner.optimizer_step()
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in module.named_parameters()}}


def supervised_accounting(stage: str, run_dir: str, data_path: str) -> dict:
    """An fsdp2 SFT, reward-model or DPO run (`supervised_stage`, 4 decoder layers) watched by
    LargestTensors: the largest tensor any op created in the step's forwards/backwards ("train"), in
    the optimizer steps ("step") and in the evaluations ("eval"); after each optimizer step, the
    model's whole and local parameter elements and the local AdamW moments'; DPO: the reference
    copy's."""
    from rlhf.train.learner import Learner
    from rlhf.train.supervised import run_supervised

    stage_, model, tok = supervised_stage(stage, run_dir, data_path, "fsdp2", num_layers=4)
    watch = LargestTensors()
    between: list[dict] = []

    phase = watch.during

    def counted_step(learner):
        norm = phase("step", learner_step)(learner)
        params = list(model.parameters())
        moments = [
            v for state in learner.optimizer.adamw.state.values() for v in state.values() if v.dim() > 0
        ]
        between.append({
            "whole": sum(p.numel() for p in params),
            "local": sum(p.to_local().numel() for p in params),
            "moments_local": sum(m.to_local().numel() for m in moments),
            "sharded": all(isinstance(p, DTensor) for p in params),
        })  # fmt: skip
        return norm

    stage_.train_step = phase("train", stage_.train_step)
    stage_.evaluate = phase("eval", stage_.evaluate)
    learner_step, Learner.optimizer_step = Learner.optimizer_step, counted_step
    try:
        with watch:
            run_supervised(stage_, model=model, tokenizer=tok, quiet=True)
    finally:
        Learner.optimizer_step = learner_step
    out = {"largest": watch.largest, "between_steps": between}
    if stage == "dpo":
        params = list(stage_.reference.model.parameters())
        out["reference"] = {
            "whole": sum(p.numel() for p in params),
            "local": sum(p.to_local().numel() for p in params),
            "sharded": all(isinstance(p, DTensor) for p in params),
        }
    return out


def rank0_verdicts(busy_run_dir: str) -> list:
    """What each rank sees of rank 0's checks (process_group.agreed_on_rank0): a check that passes
    (its result), one that refuses (a user mistake), one that fails (a bug), and the lock of a
    run directory another process holds (lock.writer_lock)."""
    from rlhf.config import ConfigError
    from rlhf.parallel.process_group import agreed_on_rank0
    from rlhf.rundir.lock import writer_lock

    def outcome(body) -> tuple:
        try:
            return ("ran", body())
        except Exception as err:  # noqa: BLE001 (what each rank raised is the point)
            return (type(err).__name__, str(err))

    def refuse():
        raise ConfigError(
            "model.reward_model: rm/model.safetensors changed. Fix: --resume-allow-changed-models"
        )

    def fail():
        raise KeyError("a bug")

    def lock():
        with writer_lock(busy_run_dir):
            return "locked"

    return [
        outcome(lambda: agreed_on_rank0(lambda: 42)),
        outcome(lambda: agreed_on_rank0(refuse)),
        outcome(lambda: agreed_on_rank0(fail)),
        outcome(lock),
    ]
