"""The PPO log-ratio clamp at +-MAX_LOG_RATIO (20): ratios beyond exp(+-20) are held there, the loss
stays finite, and the clamped tokens get no gradient; inside the bound nothing changes."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import ppo_loss
from rlhf.core.losses import MAX_LOG_RATIO


def test_the_bound_is_twenty() -> None:
    assert MAX_LOG_RATIO == 20.0


@pytest.mark.parametrize("log_ratio", [25.0, 19.0, -19.0, -25.0, 400.0, -400.0])
def test_ratio_stats_hold_the_clamped_ratio(log_ratio: float) -> None:
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.tensor([[-1.0]], dtype=torch.float64)  # A < 0: the unclipped side -A * ratio is the max
    loss, stats = ppo_loss(logp, old, None, adv, torch.ones(1, 1))
    clamped = max(-MAX_LOG_RATIO, min(MAX_LOG_RATIO, log_ratio))
    expected_ratio = math.exp(clamped)
    assert stats["ratio_max"].item() == pytest.approx(expected_ratio, rel=1e-12)
    assert stats["ratio_min"].item() == pytest.approx(expected_ratio, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    # A = -1: per token max(ratio, clip(ratio, 0.8, 1.2)) -> ratio above 1.2, 1.2 below 0.8
    if expected_ratio > 1.2:
        assert loss.item() == pytest.approx(expected_ratio, rel=1e-12)
        assert grad.item() == (
            0.0 if abs(log_ratio) > MAX_LOG_RATIO else pytest.approx(expected_ratio, rel=1e-12)
        )
    else:
        assert loss.item() == pytest.approx(0.8, rel=1e-12) and grad.item() == 0.0


def test_exploded_ratio_gives_a_finite_loss_and_zero_gradient() -> None:
    logp = torch.tensor([[1e4, 0.1]], requires_grad=True)
    old = torch.zeros(1, 2)
    loss, _ = ppo_loss(logp, old, None, torch.tensor([[-2.0, 1.0]]), torch.ones(1, 2))
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item())
    # token 0: 2 * exp(20) (held at the bound); token 1: A = 1 > 0, ratio e^0.1 < 1.2 -> -e^0.1
    assert loss.item() == pytest.approx((2 * math.exp(20.0) - math.exp(0.1)) / 2, rel=1e-6)
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == pytest.approx(-math.exp(0.1) / 2, rel=1e-6)
