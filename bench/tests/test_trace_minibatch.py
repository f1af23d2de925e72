"""One PPO minibatch update stays readable in a few files (a reader follows one minibatch
step through at most 5: trainer, role, engine, core/losses, core/advantages or stats): the
files of `rlhf/` whose code runs in the policy's step, as `bench/tools/trace_minibatch.py` traces them.

- The step's own logic is in exactly five: the trainer (minibatches, their advantages' whitening and
  clipping), the role (the PPO terms and their switches), the engine (micro-batches, backward,
  clipping, the optimizer step), core/losses.py and core/stats.py.
- The seam, runtime/local.py, only routes: the functions of it that run are the lookup of the
  learners by name, the call of each one's `train_step`, and the overlap's decision (off for one
  learner); none computes a term of the step.
- Every other file is a part of the engine the learner composes, the model's forward, a container
  or a guard after the steps (bench/tools/trace_minibatch.py `KINDS`); the total may not grow past 22
  (14, the trainer's guards and step means in their own modules, the engine's micro-batches,
  passes, optimizer and step stats, each a module of one concept, and the registries' call of a
  loss by name, core/keywords.py, which the estimator registry shares). A new file in the step must take
  one's place, or raise MOST with a reason."""

from __future__ import annotations

import pytest

from bench.tools.trace_minibatch import KINDS, kind_of, traced_files

MOST = 22
STEP = {"rl/trainer.py", "rl/roles/policy.py", "train/learner.py", "core/losses.py", "core/stats.py"}
# the seam's routing: which learners, each one's train_step, whether two run side by side
ROUTING = {
    "LocalRuntime.train",
    "LocalRuntime.steps",
    "LocalRuntime.steps.<locals>.<listcomp>",
    "LocalRuntime.steps.<locals>.<listcomp>.<listcomp>",
    "LocalRuntime.overlap_threads",
    "LocalRuntime.learning_rates",
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["vanilla_ppo", "ppo_max"])
def test_one_ppo_minibatch_step_is_read_in_five_files(preset: str) -> None:
    files = traced_files(preset, ("policy",))
    assert {name for name in files if kind_of(name) == "step"} == STEP, sorted(files)
    assert "core/advantages.py" not in files  # the whitening reads core/stats.py's masked_whiten
    assert files["runtime/local.py"] <= ROUTING, sorted(files["runtime/local.py"])
    assert all(kind_of(name) != "unsorted" for name in files), sorted(files)
    assert len(files) <= MOST, sorted(files)


def test_every_file_has_one_kind() -> None:
    names = [name for group in KINDS.values() for name in group]
    assert len(names) == len(set(names))
    assert STEP <= set(KINDS["step"])
