"""Rollout correction in the loop (docs/algorithms.md §44): its composition with decoupled PPO's
staleness weights, and `rollout.correction.enabled` reaching the Experience and the metrics."""

from __future__ import annotations

import dataclasses
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


def plain_correction(trainer_logp, sampler_logp, mask, level: str, mode: str, cap: float) -> torch.Tensor:
    """The weights by a float64 loop over each row's tokens, the masked ones (context) skipped."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        d = {t: float(trainer_logp[i, t]) - float(sampler_logp[i, t]) for t in valid}
        row_sum = sum(d.values())
        for t in valid:
            w = math.exp(row_sum if level == "sequence" else d[t])
            out[i, t] = min(w, cap) if mode == "truncate" else (w if 1 / cap <= w <= cap else 0.0)
    return out


@pytest.mark.parametrize("source", ["agent", "env"])
def test_episodes_are_corrected_over_the_policys_turns_alone(make_trainer, source, monkeypatch):
    """Multi-turn episodes (`--agent`, `--env`) keep the sampler's log-probs of the policy's turns: the
    weights are the plain loop's over those tokens alone; the tool/user tokens between the turns get
    weight 0 and add nothing to a row's sequence-level sum (the trainer's log-probs there are real)."""
    episodes = (
        {"agent": {"name": "tests.support.agents_testing:chat_agent", "batch_window_ms": 2000}}
        if source == "agent"
        else {"env": {"name": "tests.support.envs_testing:Echo", "max_turns": 3}}
    )
    correction = {"enabled": True, "level": "sequence", "mode": "truncate", "cap": 1.5}
    trainer = make_trainer(rl_config("grpo", episodes, rollout={"batch_size": 2, "samples_per_prompt": 2,
                                                                 "correction": correction}))  # fmt: skip
    generate = trainer.runtime.generate

    def skewed(prompts, return_logprobs):  # a sampler whose numerics differ from the trainer's
        rollout = generate(prompts, return_logprobs)
        assert return_logprobs and rollout.logprobs is not None
        skew = 0.3 * ((rollout.response_ids % 3) - 1).float() * rollout.response_mask
        return dataclasses.replace(rollout, logprobs=rollout.logprobs + skew)

    monkeypatch.setattr(trainer.runtime, "generate", skewed)
    experience, metrics = trainer.make_experience()
    rollout = trainer.rollouts.episodes.rollout
    mask = experience.response_mask
    context = experience.attention_mask[:, experience.prompt_length :].bool() & ~mask.bool()
    assert context.any() and experience.old_logp[context].abs().min() > 0  # real log-probs there
    sampler = rollout.logprobs
    expected = plain_correction(experience.old_logp, sampler, mask, "sequence", "truncate", 1.5)
    assert torch.allclose(experience.is_weights.double(), expected, atol=1e-5)
    assert not experience.is_weights[context].any()
    assert not torch.allclose(expected[mask.bool()], torch.ones(int(mask.sum()), dtype=torch.float64))
    raw = plain_correction(experience.old_logp, sampler, mask, "sequence", "truncate", math.inf)
    rows = [raw[i][mask[i].bool()][0] for i in range(len(raw)) if mask[i].any()]  # a row's one weight
    truncated = sum(float(w) > 1.5 for w in rows) / len(rows)
    assert metrics["rollout_correction/truncated_fraction"] == pytest.approx(truncated)
    for level in ("token", "sequence"):  # the other settings on the same episodes
        for mode in ("truncate", "mask"):
            settings = RolloutCorrectionConfig(enabled=True, level=level, mode=mode, cap=1.5)
            weights, _ = corrected_weights(settings, torch.ones_like(mask), experience.old_logp, sampler,
                                           mask, False)  # fmt: skip
            want = plain_correction(experience.old_logp, sampler, mask, level, mode, 1.5)
            assert torch.allclose(weights.double(), want, atol=1e-5), (level, mode)
