"""rollout_correction (docs/algorithms.md §44) and the covariance selection of Clip-Cov/KL-Cov (§43)
against plain float64 loops: padding never read, a batch of one, fully masked rows."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import covariance_selection, rollout_correction, token_covariance


def logps(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    sampler = trainer + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.8
    mask = torch.ones(4, 5)
    mask[0, 2:] = 0
    mask[3] = 0
    trainer[mask == 0], sampler[mask == 0] = 50.0, -50.0  # garbage at padding
    return trainer, sampler, mask


def correction_loop(trainer, sampler, mask, level, mode, cap):
    out = [[0.0] * trainer.shape[1] for _ in range(trainer.shape[0])]
    for i in range(trainer.shape[0]):
        idx = [t for t in range(trainer.shape[1]) if mask[i, t]]
        row = math.exp(sum(float(trainer[i, t] - sampler[i, t]) for t in idx))
        for t in idx:
            w = math.exp(float(trainer[i, t] - sampler[i, t])) if level == "token" else row
            out[i][t] = min(w, cap) if mode == "truncate" else (w if 1 / cap <= w <= cap else 0.0)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weights_match_a_plain_loop(level: str, mode: str) -> None:
    trainer, sampler, mask = logps()
    weights, stats = rollout_correction(trainer, sampler, mask, level=level, mode=mode, cap=1.5)
    expected = correction_loop(trainer, sampler, mask, level, mode, 1.5)
    assert torch.allclose(weights.double(), expected, rtol=1e-6)
    if level == "token":
        per_unit = expected[mask.bool()]
    else:  # one weight per row with a valid token
        per_unit = torch.stack([expected[i][mask[i].bool()][0] for i in range(4) if mask[i].any()])
    assert stats["weight_mean"] == pytest.approx(float(per_unit.mean()), rel=1e-6)
    key = "truncated_fraction" if mode == "truncate" else "masked_fraction"
    assert 0 < stats[key] < 1


def test_no_gradient_padding_zero_batch_of_one_and_fully_masked() -> None:
    trainer = torch.tensor([[-1.0, -2.0, 9.0]], requires_grad=True)
    sampler = torch.tensor([[-1.5, -2.0, -9.0]])
    weights, stats = rollout_correction(trainer, sampler, torch.tensor([[1, 1, 0]]), cap=2.0)
    assert not weights.requires_grad
    assert torch.allclose(weights, torch.tensor([[math.exp(0.5), 1.0, 0.0]]))
    assert stats["truncated_fraction"] == 0 and stats["raw_weight_max"] == pytest.approx(math.exp(0.5))
    weights, stats = rollout_correction(trainer, sampler, torch.zeros(1, 3), level="sequence", mode="mask")
    assert weights.tolist() == [[0.0, 0.0, 0.0]] and stats == {
        "weight_mean": 0.0, "raw_weight_max": 0.0, "masked_fraction": 0.0}  # fmt: skip
    with pytest.raises(ValueError, match="cap must be > 1"):
        rollout_correction(trainer, sampler, torch.ones(1, 3), cap=1.0)


def test_covariance_matches_a_loop_and_kl_cov_takes_the_top_tokens() -> None:
    trainer, _, mask = logps()
    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    adv[mask == 0] = 1e6
    valid = [(i, t) for i in range(4) for t in range(5) if mask[i, t]]
    mean_l = sum(float(trainer[i, t]) for i, t in valid) / len(valid)
    mean_a = sum(float(adv[i, t]) for i, t in valid) / len(valid)
    cov = token_covariance(trainer, adv, mask)
    for i, t in valid:
        assert float(cov[i, t]) == pytest.approx(
            (float(trainer[i, t]) - mean_l) * (float(adv[i, t]) - mean_a)
        )
    assert cov[mask == 0].abs().max() == 0
    chosen = covariance_selection(trainer, adv, mask, "kl_cov", ratio=0.2)
    n = int(0.2 * len(valid))
    top = sorted(valid, key=lambda it: -float(cov[it]))[:n]
    assert sorted(map(tuple, chosen.nonzero().tolist())) == sorted(top)


def test_clip_cov_draws_from_the_band_only_and_handles_empty_batches() -> None:
    trainer, _, mask = logps()
    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    cov = token_covariance(trainer, adv, mask)
    band = (cov > 0.1) & (cov < 2.0) & mask.bool()
    assert int(band.sum()) >= 2
    chosen = covariance_selection(trainer, adv, mask, "clip_cov", ratio=0.1, low=0.1, high=2.0,
                                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert int(chosen.sum()) == max(1, int(0.1 * int(mask.sum()))) and bool((chosen <= band).all())
    everything = covariance_selection(trainer, adv, mask, "clip_cov", ratio=1.0, low=0.1, high=2.0)
    assert torch.equal(everything, band)  # fewer eligible than n: all of them
    none = covariance_selection(trainer[:1], adv[:1], torch.zeros(1, 5), "kl_cov", ratio=0.5)
    assert not none.any()
    one = covariance_selection(trainer[:1], adv[:1], mask[:1], "kl_cov", ratio=1e-4)
    assert int(one.sum()) == 1  # at least one token
