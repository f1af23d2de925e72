"""The gspo and cispo presets end to end on the tiny world: `rlhf train`'s loop for an iteration,
every figure finite, the policy moved, the losses' own stats logged (docs/algorithms.md §40-41)."""

from __future__ import annotations

import math

import pytest

from tests.support.train_testing import max_change, metric_rows, params_of, rl_config


@pytest.mark.parametrize(
    ("preset", "stats"),
    [("gspo", ("policy/clip_fraction", "policy/ratio_mean")), ("cispo", ("policy/weight_clip_fraction",))],
)
def test_the_preset_trains_end_to_end(make_trainer, preset, stats):
    config = rl_config(
        preset, rollout={"batch_size": 4, "samples_per_prompt": 2}, train={"minibatches": 2, "iterations": 1}
    )
    trainer = make_trainer(config)
    before = params_of(trainer.runtime.roles.policy.model)
    trainer.train()
    rows = metric_rows(trainer.run_dir, kinds=("iteration",))
    assert [r["iteration"] for r in rows] == [0]
    for row in rows:
        assert all(math.isfinite(row[key]) for key in ("policy/loss", "policy/grad_norm", *stats))
        assert "value/loss" not in row  # no critic
    assert max_change(before, trainer.runtime.roles.policy.model) > 0
