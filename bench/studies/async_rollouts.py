"""Asynchronous rollouts on the built-in world: PPO-max sampled one update ahead by a
Ray rollout actor (`rollout.max_staleness 1`, decoupled PPO) against the synchronous loop.

    nice -n 10 env PYTHONPATH=. .venv/bin/python -m bench.studies.async_rollouts
        [--seeds 3] [--iterations 100] [--root runs/async_rollouts] [--json bench/results/async_rollouts.json]

One SFT model and proxy reward model (the demo's `prepare_stage`, default world), then the demo's
PPO-max settings (rlhf/demo/run.py demo_rl_overrides) in three modes:

    local   the local runtime in this process (seeds 0..S-1)
    ray     Ray with a rollout actor on one CPU and the trainer's actors on the other,
            rollout.max_staleness 0: the synchronous loop (seed 0: it gives the local numbers
            exactly, tests/ray_runtime/test_ray_runtime.py; here for its seconds per iteration)
    async   the same placement with rollout.max_staleness 1 (seeds 0..S-1)

Per run: seconds per iteration (the mean of time/iteration), and the exported policy's held-out
gold reward on the demo's evaluation prompts (rlhf/demo/held_out.py evaluate_policy, seed 1000 + seed)
minus the SFT model's; per mode the mean and 95% t interval over seeds, and async minus local
paired by seed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlhf.config import RLConfig, load_config
from rlhf.demo.ablate.stats import mean_ci
from rlhf.demo.held_out import ModulesInProcess, evaluate_policy
from rlhf.demo.run import DemoConfig, demo_rl_overrides, load_stage, prepare_stage
from rlhf.models.loading import load_causal_lm
from rlhf.models.reference import ReferenceModel
from rlhf.stages.train import run_rl

# every trainer role shares one CPU (colocated); the rollout actor has the other
TRAINER = {group: 0.25 for group in ("policy", "critic", "reference", "reward_model")}
RAY = [("dist.runtime", "ray"), ("ray.rollout.num_actors", 1), ("ray.rollout.num_cpus", 1.0)]
MODES = {"local": [], "ray": RAY, "async": [*RAY, ("rollout.max_staleness", 1)]}


def stage(cfg: DemoConfig, root: Path):
    """The world, SFT model and reward model (built once; reused on a rerun)."""
    marker = root / "stage.json"
    if marker.is_file():
        saved = json.loads(marker.read_text())
        return load_stage(cfg, root, saved["sft"], saved["rm"])
    built = prepare_stage(cfg, root, quiet=True)
    marker.write_text(json.dumps({"sft": built.sft_summary, "rm": built.rm_summary}))
    return built


def rl_config(cfg: DemoConfig, root: Path, mode: str, seed: int) -> RLConfig:
    config = load_config(RLConfig, preset="ppo_max", overrides=demo_rl_overrides(cfg, "ppo_max"))
    config.seed, config.out = seed, str(root / "runs" / f"{mode}-seed{seed}")
    config.model.policy, config.model.reward_model = str(root / "sft"), str(root / "rm")
    config.data.prompts, config.data.max_prompt_tokens = str(root / "world" / "prompts_train.jsonl"), 64
    config.log.sinks = ["jsonl"]
    for group, cpus in TRAINER.items():
        getattr(config.ray, group).num_cpus = cpus
    for key, value in MODES[mode]:
        *groups, name = key.split(".")
        target = config
        for group in groups:
            target = getattr(target, group)
        setattr(target, name, value)
    config.validate()
    return config


def one_run(cfg: DemoConfig, built, root: Path, mode: str, seed: int) -> dict:
    config = rl_config(cfg, root, mode, seed)
    started = time.perf_counter()
    run_rl(config, quiet=True)
    seconds = time.perf_counter() - started
    rows = [json.loads(x) for x in (Path(config.out) / "metrics.jsonl").read_text().splitlines()]
    iterations = [r for r in rows if "iteration" in r and "event" not in r]
    policy = load_causal_lm(config.out)
    reference = ReferenceModel(load_causal_lm(root / "sft"), mode="copy")
    record, _, _ = evaluate_policy(
        ModulesInProcess(policy, reference, built.reward_model, built.tokenizer),
        built.tokenizer,
        built.world,
        built.eval_texts,
        built.eval_ids,
        seed=1000 + seed,
        max_new_tokens=config.rollout.max_new_tokens,
    )
    return {
        "mode": mode,
        "seed": seed,
        "seconds": seconds,
        "seconds_per_iteration": sum(r["time/iteration"] for r in iterations) / len(iterations),
        "gold_gain": record["gold"] - built.sft_summary["gold_mean"],
        "kl": record["kl"],
        "staleness": [r.get("async/staleness") for r in iterations][:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--root", default="runs/async_rollouts")
    parser.add_argument("--json", default="bench/results/async_rollouts.json")
    args = parser.parse_args()
    import ray

    torch.set_num_threads(1)
    cfg = DemoConfig(iterations=args.iterations)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    built = stage(cfg, root)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    runs = []
    for seed in range(args.seeds):
        for mode in MODES:
            if mode == "ray" and seed > 0:
                continue  # the local numbers exactly; its time from seed 0
            runs.append(one_run(cfg, built, root, mode, seed))
            print(json.dumps(runs[-1]), flush=True)
    ray.shutdown()
    by = {m: [r for r in runs if r["mode"] == m] for m in MODES}
    summary = {
        m: {
            "seconds_per_iteration": mean_ci([r["seconds_per_iteration"] for r in rs]),
            "gold_gain": mean_ci([r["gold_gain"] for r in rs]),
        }
        for m, rs in by.items()
    }
    pairs = zip(by["async"], by["local"])
    summary["async_minus_local_gold_gain"] = mean_ci([a["gold_gain"] - b["gold_gain"] for a, b in pairs])
    summary["speedup_async_over_ray_sync"] = (
        summary["ray"]["seconds_per_iteration"]["mean"] / summary["async"]["seconds_per_iteration"]["mean"]
    )
    out = {
        "command": vars(args),
        "runs": runs,
        "summary": summary,
        "machine": f"{torch.get_num_threads()} thread(s)",
    }
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
