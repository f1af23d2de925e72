"""Rollout correction in the loop (docs/algorithms.md §44): its composition with decoupled PPO's
staleness weights, and `rollout.correction.enabled` reaching the Experience and the metrics."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.config.rollout import RolloutCorrectionConfig
from rlhf.core import decoupled_is_weights, rollout_correction
from rlhf.rl.rollout_correction import corrected_weights
from tests.support.train_testing import rl_config

TRAINER = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.3, 0.3, 0.3]]))
SAMPLER = torch.log(torch.tensor([[0.25, 0.9, 0.4], [0.3, 0.1, 0.3]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_off_leaves_the_staleness_weights_as_they_are():
    staleness = torch.full_like(MASK, 0.5)
    weights, metrics = corrected_weights(RolloutCorrectionConfig(), staleness, TRAINER, SAMPLER, MASK, True)
    assert weights is staleness and metrics == {}


def test_synchronous_the_weight_is_the_product_of_staleness_and_correction():
    settings = RolloutCorrectionConfig(enabled=True, level="token", mode="truncate", cap=1.5)
    staleness = torch.tensor([[1.0, 0.5, 2.0], [1.0, 1.0, 0.0]])  # any per-token factor
    weights, metrics = corrected_weights(settings, staleness, TRAINER, SAMPLER, MASK, False)
    # the plain product: 0.5/0.25 = 2 -> 1.5; 1; 0.2/0.4 = 0.5; 1; 0.3/0.1 = 3 -> 1.5; padding 0
    expected = torch.tensor([[1.0 * 1.5, 0.5 * 1.0, 2.0 * 0.5], [1.0 * 1.0, 1.0 * 1.5, 0.0]])
    assert torch.allclose(weights, expected)
    assert metrics["rollout_correction/truncated_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx((1.5 + 1 + 0.5 + 1 + 1.5) / 5)


def test_asynchronous_the_one_ratio_is_corrected_once_not_twice():
    """Decoupled PPO's weight and the correction share the sampler's log-probs as denominator: the
    correction's rule replaces the staleness truncation instead of multiplying it a second time."""
    staleness, _ = decoupled_is_weights(TRAINER, SAMPLER, MASK, truncation=2.0)
    settings = RolloutCorrectionConfig(enabled=True, level="sequence", mode="mask", cap=4.0)
    weights, _ = corrected_weights(settings, staleness, TRAINER, SAMPLER, MASK, True)
    alone, _ = rollout_correction(TRAINER, SAMPLER, MASK, level="sequence", mode="mask", cap=4.0)
    assert torch.equal(weights, alone)
    # row 0: 2 * 1 * 0.5 = 1 -> kept; row 1: 1 * 3 = 3 -> kept (inside [1/4, 4])
    assert torch.allclose(weights, torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]]))
    assert not torch.allclose(weights, staleness * alone)  # the double count it avoids


def test_a_rollout_without_sampler_log_probs_is_an_error():
    with pytest.raises(RuntimeError, match="sampler's log-probs"):
        corrected_weights(
            RolloutCorrectionConfig(enabled=True), torch.ones_like(MASK), TRAINER, None, MASK, False
        )


def test_the_switch_reaches_the_experience_and_the_metrics(make_trainer):
    config = rl_config("grpo", rollout={"batch_size": 4, "samples_per_prompt": 2,
                                       "correction": {"enabled": True, "level": "sequence", "cap": 1.5}})  # fmt: skip
    trainer = make_trainer(config)
    experience, metrics = trainer.make_experience()
    weights = experience.is_weights
    assert weights is not None
    valid = experience.response_mask.bool()
    assert weights[~valid].abs().max() == 0
    # one sampler and one trainer in float32 on the CPU: the same log-probs up to rounding
    assert torch.allclose(weights[valid], torch.ones(int(valid.sum())), atol=1e-4)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_correction/truncated_fraction"] == 0
    assert math.isfinite(trainer.update(experience)["policy/loss"])
    experience.is_weights = torch.zeros_like(weights)  # the update multiplies the advantages by them
    assert trainer.update(experience)["policy/loss"] == 0
