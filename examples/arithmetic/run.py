"""Verifiable rewards on a laptop CPU: a tiny Llama learns addition from an exact verifier.

    PYTHONPATH=. python examples/arithmetic/run.py --out runs/arith --algorithm grpo

1. writes the built-in arithmetic task (rlhf/worlds/arithmetic.py): word problems "tom has 3 apples
   and gets 4 more . how many apples ?" with the sum as a one-token answer, train and held-out phrasings;
2. builds a tiny Llama and warms it up by SFT on the answer's *format* (random answers: it learns
   to answer with a number, not which one);
3. measures its greedy accuracy on the held-out problems (Wilson 95% interval);
4. trains it with `rlhf train`'s stage (the preset --algorithm) against the verifier alone,
   `--reward-fn rlhf.worlds.arithmetic:correct`, no reward model;
5. measures the trained policy the same way and writes results.json.

The same RL step from the command line, once steps 1-2 wrote the task and the SFT model:

    rlhf train --preset grpo --policy runs/arith/sft --prompts runs/arith/task/prompts_train.jsonl \\
        --reward-fn rlhf.worlds.arithmetic:correct --rollout.max_new_tokens 4 ...

docs/verifiable_rewards.md has the measured numbers and the flags.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from rlhf.config import (
    OptimConfig,
    RLConfig,
    SFTConfig,
    SFTDataConfig,
    SFTTrainConfig,
    deep_merge,
    load_config,
    parse_overrides,
)
from rlhf.data.tokenize import encode_prompt
from rlhf.evaluation.judging import decode_responses, sample_responses, wilson_interval
from rlhf.models.loading import load_causal_lm
from rlhf.models.sampling import SamplingConfig
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.sft import run_sft
from rlhf.stages.train import run_rl
from rlhf.worlds.arithmetic import ArithmeticConfig, build_arithmetic, correct

MAX_NEW_TOKENS = 4  # the answer and its EOS, with room for a wrong longer one
# every RL run: tiny models want large rates; 256 answers per iteration (32 prompts x 8); the verifier alone
RL_SETTINGS = {
    "rollout": {
        "batch_size": 32,
        "samples_per_prompt": 8,
        "max_new_tokens": MAX_NEW_TOKENS,
        "temperature": 1.0,
    },
    "train": {"ppo_epochs": 1, "minibatches": 2, "micro_batch_size": 256, "device": "cpu"},
    "policy_optim": {"lr": 1e-3, "warmup_fraction": 0.0},
    "reward": {"functions": ["rlhf.worlds.arithmetic:correct"]},
    "log": {"sinks": ["jsonl"]},
    "dtype": "float32",
}
PER_ALGORITHM = {
    # critic-free presets as shipped, but GRPO's KL term in the loss off: the verifier is the only
    # signal, as in DAPO (DAPO paper §2.3: no KL term)
    "grpo": {"policy": {"kl_loss_coef": 0.0}},
    "dr_grpo": {
        "advantage": {"estimator": "dr_grpo"},
        "policy": {"loss_aggregation": "fixed_length", "kl_loss_coef": 0.0},
    },
    "rloo": {},
    "reinforce_pp": {"rollout": {"samples_per_prompt": 1, "batch_size": 256}},
    # DAPO as shipped: its overlong ramp is a fifth of the 4-token budget, the last token (-1 without EOS)
    "dapo": {},
    # GSPO and CISPO as shipped (docs/algorithms.md §41-42)
    "gspo": {},
    "cispo": {},
    # PPO-max: a critic from the SFT trunk (there is no reward model to start it from)
    "ppo_max": {
        "model": {"critic_init": "policy"},
        "rollout": {"samples_per_prompt": 1, "batch_size": 256},
        "critic": {"pretrain_iterations": 0},
        "critic_optim": {"lr": 1e-3, "warmup_fraction": 0.0},
        "policy": {"ptx_coef": 0.0},
    },
}


def accuracy(model, tokenizer, problems: list[dict]) -> dict:
    """Greedy accuracy of `model` on `problems` with its 95% Wilson interval."""
    prompts = [encode_prompt(tokenizer, p["prompt"], 64) for p in problems]
    sampling = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    rollouts, _ = sample_responses(model, tokenizer, prompts, sampling, seed=0, batch_size=256)
    texts = [t for r in rollouts for t in decode_responses(tokenizer, r)]
    right = correct(texts, [p["answer"] for p in problems])
    n, hits = len(right), int(sum(right))
    return {"accuracy": hits / n, "ci95": wilson_interval(hits, n), "n": n, "correct": hits}


def warm_up(task, out: Path, steps: int, seed: int) -> Path:
    """A tiny Llama SFT'd on the task's format (out/sft)."""
    model = tiny_causal_lm(task.tokenizer, seed=seed, hidden_size=64, num_layers=2, num_heads=4)
    config = SFTConfig(
        out=str(out / "sft"),
        seed=seed,
        data=SFTDataConfig(path=str(out / "task" / "sft_train.jsonl"), test_fraction=0.05),
        train=SFTTrainConfig(max_steps=steps, batch_size=32, micro_batch_size=32, eval_every=steps),
        optim=OptimConfig(lr=3e-3, warmup_steps=max(1, steps // 20), schedule="cosine", min_lr_ratio=0.1),
        sinks=["jsonl"],
    )
    run_sft(config, model=model, tokenizer=task.tokenizer, quiet=True)
    return out / "sft"


def rl_config(algorithm: str, out: Path, iterations: int, seed: int, extra: dict) -> RLConfig:
    preset = "grpo" if algorithm == "dr_grpo" else algorithm
    layers = deep_merge(deep_merge(RL_SETTINGS, PER_ALGORITHM[algorithm]), extra)
    layers = deep_merge(layers, {"train": {"iterations": iterations}})
    config = load_config(RLConfig, preset=preset, overrides=layers)
    config.seed = seed
    config.out = str(out / f"rl-{algorithm}-seed{seed}")
    config.model.policy = str(out / "sft")
    config.data.prompts = str(out / "task" / "prompts_train.jsonl")
    return config


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/arith")
    parser.add_argument("--algorithm", default="grpo", choices=sorted(PER_ALGORITHM))
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sft-correct-rate",
        type=float,
        default=ArithmeticConfig.sft_correct_rate,
        help="share of right answers in the warm-up data (0: the format alone)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny models: 1)")
    parser.add_argument("--max-operand", type=int, default=ArithmeticConfig.max_operand)
    parser.add_argument("--heldout-templates", type=int, default=ArithmeticConfig.heldout_templates_per_pair)
    parser.add_argument("--names", type=int, default=ArithmeticConfig.names_per_problem)
    args, rest = parser.parse_known_args(argv)  # the rest: RL overrides, e.g. --policy_optim.lr 5e-4
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    extra = parse_overrides(rest)
    task = build_arithmetic(
        ArithmeticConfig(
            seed=args.seed,
            max_operand=args.max_operand,
            heldout_templates_per_pair=args.heldout_templates,
            names_per_problem=args.names,
            sft_correct_rate=args.sft_correct_rate,
        )
    )
    task.write(out / "task")
    t0 = time.perf_counter()
    if not (out / "sft" / "config.json").exists():
        warm_up(task, out, args.sft_steps, args.seed)
    sft_seconds = time.perf_counter() - t0
    tokenizer = task.tokenizer
    before = accuracy(load_causal_lm(out / "sft"), tokenizer, task.test)
    print(f"SFT warm-up: held-out accuracy {_show(before)}", flush=True)
    config = rl_config(args.algorithm, out, args.iterations, args.seed, extra)
    shutil.rmtree(config.out, ignore_errors=True)  # this script's own run directory: trained afresh
    t1 = time.perf_counter()
    run_rl(config, quiet=True)
    rl_seconds = time.perf_counter() - t1
    after = accuracy(load_causal_lm(config.out), tokenizer, task.test)
    train_after = accuracy(load_causal_lm(config.out), tokenizer, task.train)
    print(f"{args.algorithm} after {args.iterations} iterations ({rl_seconds:.0f} s): held-out accuracy "
          f"{_show(after)}; training prompts {_show(train_after)}", flush=True)  # fmt: skip
    result = {
        "algorithm": args.algorithm,
        "seed": args.seed,
        "iterations": args.iterations,
        "sft_steps": args.sft_steps,
        "task": asdict(task.config),
        "held_out_problems": len(task.test),
        "before": before,
        "after": after,
        "train_after": train_after,
        "seconds": {"sft": round(sft_seconds, 1), "rl": round(rl_seconds, 1)},
        "overrides": extra,
    }
    path = out / f"results-{args.algorithm}-seed{args.seed}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {path}")
    return result


def _show(stat: dict) -> str:
    low, high = stat["ci95"]
    return f"{stat['accuracy']:.1%} [{low:.1%}, {high:.1%}] ({stat['correct']}/{stat['n']})"


if __name__ == "__main__":
    main()
