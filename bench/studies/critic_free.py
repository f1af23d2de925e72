"""GRPO and RLOO against PPO-max on the built-in world, at equal numbers of sampled responses.

    .venv/bin/python bench/studies/critic_free.py [--dir runs/critic_free] [--iterations 100] [--seeds 1]

Builds the demo's world, SFT model and proxy reward model once (`rlhf demo` with one PPO-max
iteration), then runs each algorithm in a fresh process exactly as `rlhf demo --compare` does
(demo.rl_overrides: 64 responses per iteration for everyone) and records, per run: the gold gain
over SFT (in SFT gold standard deviations) and the KL to SFT on held-out prompts, the mean wall
time of an iteration (`time/iteration`, which excludes the held-out evaluation), and the process's
peak resident memory (the RL process alone).

The tiny demo models (~0.1M parameters) make memory a matter of the Python process, so
`--smollm2 DIR` adds the memory case that shows what dropping the critic saves: SmolLM2-135M
(float32 HF directory), LoRA policy (its reference: the adapter off) and, for PPO-max, a LoRA
critic on its own copy of the reward model (the model with a scalar head); 8 responses
of 16 tokens per iteration, 3 iterations of each algorithm in a fresh process: peak RSS and the
mean seconds of the last two iterations. Writes bench/results/critic_free.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = ("ppo_max", "grpo", "rloo")


def one_run(directory: Path, algorithm: str, seed: int, iterations: int) -> dict:
    """One RL run in this process (called in a child process); its figures."""
    import torch

    from rlhf.demo.run import DemoConfig, run_one
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.worlds import build_world

    torch.set_num_threads(1)
    shutil.rmtree(directory / "runs" / f"{algorithm}-seed{seed}", ignore_errors=True)  # a fresh run
    cfg = DemoConfig(iterations=iterations)
    world = build_world(cfg.world)
    reward_model = ScalarHeadModel.from_pretrained(directory / "rm").eval()
    summary = json.loads((directory / "summary.json").read_text())
    eval_texts, eval_ids = _eval_prompts(directory, world, cfg)
    run, result = run_one(
        cfg,
        algorithm,
        seed,
        directory,
        world.tokenizer,
        reward_model,
        world,
        eval_texts,
        eval_ids,
        quiet=True,
    )
    sft = summary["sft"]
    times = [m["time/iteration"] for m in run["metrics"] if "time/iteration" in m]
    return {
        "algorithm": algorithm,
        "seed": seed,
        "gold_gain_sft_std": (result["final"]["gold"] - sft["gold_mean"]) / sft["gold_std"],
        "gold": result["final"]["gold"],
        "kl": result["final"]["kl"],
        "collapse": result["collapse_detected"],
        "seconds_per_iteration": statistics.mean(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "responses_per_iteration": len(run["metrics"][0]["reward/raw_scores"]),
    }


def smollm2_run(model_dir: Path, algorithm: str, iterations: int) -> dict:
    """A few iterations of `algorithm` on SmolLM2-135M in this process: peak RSS, seconds/iteration."""
    import copy
    import tempfile

    import torch

    from bench.speed.smollm2 import chat_prompts, load, rss_mb
    from rlhf.config import RLConfig, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    torch.set_num_threads(1)
    tokenizer, policy = load(model_dir)
    torch.manual_seed(1)
    reward_model = ScalarHeadModel.from_causal_lm(copy.deepcopy(policy))
    loaded = rss_mb()
    preset = load_config(RLConfig, preset=algorithm)
    n = preset.rollout.samples_per_prompt if not preset.uses_critic else 1
    n = 4 if n > 1 else 1  # 8 responses: 8 prompts x 1, or 2 prompts x 4
    overrides = {
        "out": tempfile.mkdtemp(prefix="bench_critic_free_"),
        "rollout": {
            "batch_size": 8 // n,
            "samples_per_prompt": n,
            "max_new_tokens": 16,
            "stop_at_eos": False,
        },
        "train": {"micro_batch_size": 8, "iterations": iterations, "minibatches": 1},
        "log": {"sinks": []},
        "model": {"lora": {"enabled": True}},
    }
    if preset.uses_critic:
        overrides["critic"] = {"pretrain_iterations": 0}
        overrides["model"]["critic_lora"] = {"enabled": True}
    config = load_config(RLConfig, preset=algorithm, overrides=overrides)
    roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
    trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), chat_prompts(tokenizer, 64), quiet=True)
    seconds = []
    for _ in range(iterations):
        started = time.perf_counter()
        trainer.step()
        trainer.iteration += 1
        seconds.append(time.perf_counter() - started)
    trainer.logger.close()
    trained = [p for r in roles.learners() for p in r.learner.trainable()]
    return {
        "algorithm": algorithm,
        "model": "SmolLM2-135M",
        "critic": roles.critic is not None,
        "trained_parameters_m": sum(p.numel() for p in trained) / 1e6,
        "rss_after_loading_mb": loaded,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds_per_iteration": statistics.mean(seconds[1:] or seconds),
    }


def _eval_prompts(directory: Path, world, cfg) -> tuple[list[str], list[list[int]]]:
    from rlhf.data.loading import load_examples
    from rlhf.data.tokenize import encode_prompt

    texts = [
        ex.prompt for ex in load_examples(directory / "world" / "prompts_test.jsonl", kind="prompt").examples
    ]
    eval_texts = [texts[i % len(texts)] for i in range(cfg.eval_prompts)]
    return eval_texts, [encode_prompt(world.tokenizer, p, 64) for p in eval_texts]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default="runs/critic_free")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--smollm2", metavar="DIR", help="also the SmolLM2-135M memory case (float32 HF dir)")
    parser.add_argument("--skip-demo", action="store_true", help="only the SmolLM2 case")
    parser.add_argument("--one", nargs=2, metavar=("ALGORITHM", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--one-smollm2", metavar="ALGORITHM", help=argparse.SUPPRESS)
    args = parser.parse_args()
    directory = Path(args.dir)
    if args.one:
        print(json.dumps(one_run(directory, args.one[0], int(args.one[1]), args.iterations)))
        return 0
    if args.one_smollm2:
        print(json.dumps(smollm2_run(Path(args.smollm2), args.one_smollm2, 3)))
        return 0
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "demo_iterations": args.iterations,
        "smollm2_iterations": 3,
    }
    if args.smollm2:
        results["smollm2"] = []
        for algorithm in ALGORITHMS:
            command = [sys.executable, __file__, "--smollm2", args.smollm2, "--one-smollm2", algorithm]
            done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
            results["smollm2"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results["smollm2"][-1]))
    if args.skip_demo:
        (ROOT / "bench" / "results" / "critic_free_smollm2.json").write_text(json.dumps(results, indent=2))
        return 0
    from rlhf.demo.run import run_demo

    run_demo(out=str(directory), overrides=["--iterations", "1"], quiet=True)  # world, SFT, reward model
    rows = []
    for algorithm in ALGORITHMS:
        for seed in range(args.seeds):
            command = [
                sys.executable,
                __file__,
                "--dir",
                str(directory),
                "--iterations",
                str(args.iterations),
            ]
            done = subprocess.run(
                [*command, "--one", algorithm, str(seed)], check=True, capture_output=True, text=True
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]))
    results["runs"] = rows
    out = ROOT / "bench" / "results" / "critic_free.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"{'algorithm':10} {'gold gain (SFT std)':>20} {'KL':>7} {'s/iter':>7} {'peak MB':>8}")
    for algorithm in ALGORITHMS:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        gains = [r["gold_gain_sft_std"] for r in mine]
        print(
            f"{algorithm:10} {statistics.mean(gains):>12.2f} [{min(gains):.2f}, {max(gains):.2f}]"
            f" {statistics.mean(r['kl'] for r in mine):>7.2f}"
            f" {statistics.mean(r['seconds_per_iteration'] for r in mine):>7.3f}"
            f" {statistics.mean(r['peak_rss_mb'] for r in mine):>8.0f}"
        )
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
