"""One PPO minibatch update stays readable in a few files (issue 36): the files of `rlhf/` whose code
runs in the policy's step, as `bench/trace_minibatch.py` traces it, may not grow past today's.

Today's 15, by what a reader follows there (core/advantages.py's whitening, core/losses.py's PPO
loss and KL estimators, core/stats.py's masked means; the trainer, the runtime, the role and its
forward, the engine; the experience, the roles' lookup; the model's parts, log-probs, precision,
checkpointing in eval; the engine's micro-batch grouping). ppo_max, which whitens no advantages, runs
through 14 (no core/advantages.py). A new file in the step must take one's place, or raise MOST with
a reason."""

from __future__ import annotations

import pytest

from bench.trace_minibatch import traced_files

MOST = 15
# what a reader must follow through the update: the trainer, the role, the engine, core/
READ = {"rl/trainer.py", "rl/roles/policy.py", "train/learner.py", "core/losses.py", "core/advantages.py"}


@pytest.mark.slow
def test_one_ppo_minibatch_runs_through_at_most_most_files():
    files = traced_files("vanilla_ppo", ("policy",))
    assert READ <= set(files), sorted(files)
    assert len(files) <= MOST, sorted(files)


@pytest.mark.slow
def test_ppo_max_minibatch_leaves_the_advantage_estimators_out():
    files = traced_files("ppo_max", ("policy",))
    assert READ - {"core/advantages.py"} <= set(files), sorted(files)
    assert "core/advantages.py" not in files and len(files) <= MOST - 1, sorted(files)
