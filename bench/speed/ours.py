"""Our PPO iteration on the peer workload (one subprocess per case; the last stdout line is JSON).

    .venv/bin/python -m bench.speed.ours --workload small-4x4 --iters 6 --warmup 1

Same work as ../shared/bench/peer/trl_ppo_bench.py: B=16 prompts, L=32 sampled tokens with no
EOS stop (every response is exactly L tokens), temperature 0.7, epochs x minibatches optimizer
steps of policy and critic. Preset vanilla_ppo (no extras TRL lacks).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile

from bench.common import emit, peak_rss_mb, set_threads, timed
from bench.speed.workload import WORKLOADS, build_causal_lm, build_prompts, build_tokenizer

PHASES = ("generate", "score", "forward", "update")


def build_trainer(workload, seed: int, run_dir: str, extra: dict | None = None, runtime=None):
    """RLTrainer on the workload: vanilla_ppo, the peer's shapes, EOS never stops a response.
    `extra`: config overrides on top (for A/B runs, e.g. {"runtime": {"overlap_critic": False}});
    `runtime(roles, config)`: the runtime that serves the roles (LocalRuntime when None)."""
    from bench.speed.workload import SIZES

    rng = random.Random(seed)
    tokenizer, words = build_tokenizer(SIZES[workload.size]["vocab"], rng)
    prompts = build_prompts(tokenizer, words, rng)
    policy = build_causal_lm(workload.size, tokenizer, seed)
    reward_lm = build_causal_lm(workload.size, tokenizer, seed + 2)
    return trainer_on(workload, tokenizer, prompts, policy, reward_lm, seed, run_dir, extra, runtime)


def trainer_on(
    workload, tokenizer, prompts, policy, reward_lm, seed: int, run_dir: str, extra: dict | None, runtime=None
):
    """RLTrainer with preset vanilla_ppo running `workload`'s rollout shape and update schedule on
    the given models (the reward model is `reward_lm` with a scalar head)."""
    from rlhf.config import RLConfig, deep_merge, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    reward_model = ScalarHeadModel.from_causal_lm(reward_lm)
    overrides = {
        "out": run_dir,
        "seed": seed,
        "rollout": {
            "batch_size": workload.batch_size,
            "max_new_tokens": workload.response_length,
            "temperature": workload.temperature,
            "stop_at_eos": False,  # every response is exactly L tokens, as TRL's stop_token=None
            "logprobs_from_sampler": True,  # TRL's old log-probs also come from its sampling logits
        },
        "train": {
            "ppo_epochs": workload.ppo_epochs,
            "minibatches": workload.minibatches,
            "micro_batch_size": workload.batch_size,
            "iterations": 1000,
        },
        "critic": {"pretrain_iterations": 0},
        "log": {"sinks": []},
    }
    config = load_config(RLConfig, preset="vanilla_ppo", overrides=deep_merge(overrides, extra or {}))
    roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
    served = runtime(roles, config) if runtime is not None else LocalRuntime(roles, config.runtime)
    trainer = RLTrainer(config, served, prompts, run_dir=run_dir, quiet=True)
    return trainer


def run_iterations(trainer, iters: int, device: str = "cpu") -> list[dict]:
    """Call trainer.step() `iters` times (as RLTrainer.train does), timing each call (`device`
    idle at both ends of each, bench/common.py)."""
    rows = []
    for _ in range(iters):
        wall, metrics = timed(trainer.step, device)
        trainer.iteration += 1
        rows.append({"wall": wall, **{p: metrics[f"time/{p}"] for p in PHASES}, "shape": trainer.last_shape})
    return rows


def record_shapes(trainer) -> None:
    """Wrap make_experience to remember (B, P, T) of each rollout (for the FLOP count)."""
    original = trainer.make_experience

    def wrapped():
        experience, metrics = original()
        trainer.last_shape = (
            experience.batch_size,
            experience.prompt_length,
            experience.response_mask.shape[1],
        )
        return experience, metrics

    trainer.make_experience = wrapped


def summarize(rows: list[dict], warmup: int) -> dict:
    """Medians over the iterations after `warmup`: wall time, each phase's time and FLOP rate."""
    steady = rows[warmup:] if len(rows) > warmup else rows
    out = {
        "iter_s": [round(r["wall"], 4) for r in rows],
        "s_per_iter_median": statistics.median(r["wall"] for r in steady),
    }
    for p in PHASES:
        out[f"{p}_s_median"] = statistics.median(r[p] for r in steady)
        out[f"{p}_gflops"] = statistics.median(r["flops"][p] / 1e9 for r in steady)
        out[f"{p}_gflop_per_s"] = statistics.median(r["flops"][p] / 1e9 / r[p] for r in steady)
    return out


def phase_flops(trainer, shape: tuple[int, int, int], ppo_epochs: int, lora_policy: bool = False) -> dict:
    from bench.speed.flops import IterationShape, ModelShape, iteration_phases
    from rlhf.models.backbone import unwrap_causal_lm

    r = trainer.runtime.roles
    rows, prompt, response = shape
    return iteration_phases(
        ModelShape.from_config(unwrap_causal_lm(r.policy.model).config),
        ModelShape.from_config(unwrap_causal_lm(r.critic.model.causal_lm).config),
        ModelShape.from_config(unwrap_causal_lm(r.reward_model.model.causal_lm).config),
        IterationShape(
            rows=rows,
            prompt=prompt,
            response=response,
            ppo_epochs=ppo_epochs,
            lora_policy=lora_policy,
            old_logp_forward=not trainer.config.rollout.logprobs_from_sampler,
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=[w.name for w in WORKLOADS], required=True)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args, config_args = parser.parse_known_args()  # the rest: config overrides, --group.key value
    set_threads(args.threads)
    workload = next(w for w in WORKLOADS if w.name == args.workload)
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as run_dir:
        from rlhf.config import parse_overrides

        trainer = build_trainer(workload, args.seed, run_dir, parse_overrides(config_args))
        record_shapes(trainer)
        rows = run_iterations(trainer, args.iters)
        trainer.logger.close()
    for row in rows:
        row["flops"] = phase_flops(trainer, row["shape"], workload.ppo_epochs)
    result = {"framework": "rlhf", "workload": workload.name, **summarize(rows, args.warmup)}
    result["shapes_BPT"] = [list(r["shape"]) for r in rows]
    result["peak_rss_mb"] = peak_rss_mb()
    emit(result)


if __name__ == "__main__":
    main()
