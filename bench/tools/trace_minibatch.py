"""The files of the package one PPO minibatch update runs through (a reader should
follow one minibatch step through at most 5 files).

A tiny Llama policy, critic and reward model on the local runtime (`vanilla_ppo`, one minibatch,
one epoch): one rollout is made into experience untraced, then `RLTrainer.update` runs under
`sys.settrace` (and `threading.settrace`, for the overlapped critic) and every file of `rlhf/` whose
code ran is listed, with how many of its functions ran. `--roles policy` (the default) traces the
policy's step alone, as the trainer runs it; `--roles policy,critic` the critic's too.

Each traced file is listed under what a reader does with it (`KINDS`): the **step** files hold the
minibatch step's own logic, the five a reader follows for the policy (the trainer, the role, the
engine, core/losses, core/stats; the critic's role a sixth when `--roles` names it); the **engine**
files are the parts the learner composes (micro-batches, passes, optimizer, step stats); the **seam**
(runtime/local.py) routes each learner's `train_step` by name and computes nothing of the step (with
the critic, it schedules the two learners' steps side by side); the **dispatch** (core/keywords.py)
calls the registered loss by name; the **model** files are the
forwards (log-probs, entropy, values); the **containers** hold the minibatch and the roles' lookup;
the **guards** run after the steps (the skipped-step streak, the mean of the steps' stats).

    python bench/tools/trace_minibatch.py [--preset vanilla_ppo] [--roles policy] [--functions]

bench/tests/test_trace_minibatch.py keeps the count from growing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf"
# what a reader does with each file one minibatch step runs through (the module docstring)
KINDS = {
    "step": (
        "rl/trainer.py",
        "rl/roles/policy.py",
        "train/learner.py",
        "core/losses.py",
        "core/stats.py",
        "rl/roles/critic.py",
    ),
    # the engine's parts the learner (train/learner.py) composes, one concept each: the micro-batches,
    # a step's passes, the optimizer and the step's statistics
    "engine": (
        "train/micro_batches.py",
        "train/accumulation.py",
        "train/optimizer.py",
        "train/step_stats.py",
        "parallel/data_parallel.py",
    ),
    "seam": ("runtime/local.py", "parallel/threads.py", "runtime/flops.py"),
    # the loss registry's call of the registered function with the caller's keywords
    "dispatch": ("core/keywords.py",),
    "model": (
        "models/scalar_head.py",
        "rl/roles/forward.py",
        "models/backbone.py",
        "models/logprobs.py",
        "models/precision.py",
        "models/grad_checkpointing.py",
    ),
    "containers": ("rl/experience.py", "rl/roles/assemble.py", "data/length_grouping.py"),
    # after the step: the run's guard on skipped steps and the mean of the steps' stats
    "guards": ("rl/run_guards.py", "train/guards.py", "rl/metrics.py"),
}
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


def tiny_trainer(preset: str, run_dir: Path):
    """An RLTrainer on a 20-word vocabulary and one-layer Llama models (as tests/support builds them),
    one minibatch of 8 rollouts per update."""
    import torch

    from rlhf.config import RLConfig, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    torch.manual_seed(0)
    tok = word_tokenizer([" ".join(WORDS)])
    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    reward_model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2), head_init_std=0.5
    )
    overrides = {
        "seed": 0,
        "out": str(run_dir),
        "train": {"iterations": 1, "micro_batch_size": 4, "minibatches": 1, "ppo_epochs": 1},
        "rollout": {"batch_size": 8, "max_new_tokens": 5},
        "log": {"sinks": ["jsonl"]},
    }
    config = load_config(RLConfig, preset=preset, overrides=overrides)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    prompts = [tok(" ".join(WORDS[i : i + 2 + i % 3]))["input_ids"] for i in range(12)]
    return RLTrainer(config, LocalRuntime(roles, config.runtime), prompts, run_dir=run_dir, quiet=True)


def traced_files(preset: str = "vanilla_ppo", roles: tuple[str, ...] = ("policy",)) -> dict[str, set[str]]:
    """{file of rlhf/ (relative to the package): the functions of it that ran} during one
    `RLTrainer.update` of one minibatch, training only `roles`."""
    ran: dict[str, set[str]] = defaultdict(set)
    root = str(PACKAGE) + "/"

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(root):
            ran[name[len(root) :]].add(frame.f_code.co_qualname)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = tiny_trainer(preset, Path(tmp) / "run")
        experience, _ = trainer.make_experience()
        names = [n for n in trainer.runtime.learner_names(True) if n in roles]
        trainer.runtime.learner_names = lambda train_policy=True: names  # type: ignore[method-assign]
        threading.settrace(tracer)  # type: ignore[arg-type]
        sys.settrace(tracer)  # type: ignore[arg-type]
        try:
            trainer.update(experience)
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
    return dict(ran)


def kind_of(name: str) -> str:
    """The kind of a traced file (`KINDS`), "unsorted" for one no kind names."""
    return next((kind for kind, names in KINDS.items() if name in names), "unsorted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="vanilla_ppo")
    parser.add_argument("--roles", default="policy", help="the learners trained, comma-separated")
    parser.add_argument("--functions", action="store_true", help="list each file's functions that ran")
    args = parser.parse_args()
    files = traced_files(args.preset, tuple(args.roles.split(",")))
    print(f"{len(files)} files of rlhf/ run by one {args.preset} minibatch update of {args.roles}:")
    for kind in (*KINDS, "unsorted"):
        names = sorted(name for name in files if kind_of(name) == kind)
        if names:
            print(f"{kind} ({len(names)}):")
        for name in names:
            print(f"  rlhf/{name} ({len(files[name])} functions)")
            if args.functions:
                for function in sorted(files[name]):
                    print(f"      {function}")


if __name__ == "__main__":
    main()
