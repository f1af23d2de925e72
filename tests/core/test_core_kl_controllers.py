"""KL-coefficient controllers at their edges: KL off (beta 0), no samples, the clip bounds, resume."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import AdaptiveKLController, FixedKLController, token_rewards


def test_fixed_zero_coefficient_turns_the_kl_penalty_off() -> None:
    controller = FixedKLController(0.0)
    controller.update(5.0, n_steps=8)
    assert controller.value == 0.0 and controller.state_dict() == {"value": 0.0}
    kl = torch.tensor([[0.3, -0.2, 0.9]])
    rewards = token_rewards(torch.tensor([2.0]), kl, torch.ones(1, 3), controller.value)
    assert rewards.tolist() == [[0.0, 0.0, 2.0]]  # only the score, at the last token


def test_fixed_controller_rejects_non_finite_values() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="KL coefficient must be finite"):
            FixedKLController(bad)
    controller = FixedKLController(0.1)
    with pytest.raises(ValueError, match="state 'value' must be finite"):
        controller.load_state_dict({"value": float("nan")})


def test_adaptive_update_with_no_samples_keeps_beta() -> None:
    controller = AdaptiveKLController(init=0.2, target=6.0, horizon=100)
    controller.update(60.0, n_steps=0)  # far above target, but no samples: 1 + e * 0 / horizon
    assert controller.value == 0.2
    controller.update(60.0, n_steps=100)  # exactly one horizon is allowed: * (1 + 0.2)
    assert controller.value == pytest.approx(0.24, rel=1e-15)
    with pytest.raises(ValueError, match="n_steps=-1"):
        controller.update(1.0, n_steps=-1)
    with pytest.raises(ValueError, match="n_steps=101"):
        controller.update(1.0, n_steps=101)


@pytest.mark.parametrize("kl", [0.0, 3.0, 4.8, 6.0, 7.2, 9.0, 60.0])
def test_adaptive_update_matches_the_formula(kl: float) -> None:
    init, target, horizon, n = 0.05, 6.0, 50.0, 10
    controller = AdaptiveKLController(init=init, target=target, horizon=horizon)
    controller.update(kl, n_steps=n)
    error = kl / target - 1.0
    clipped = -0.2 if error < -0.2 else (0.2 if error > 0.2 else error)
    assert controller.value == pytest.approx(init * (1 + clipped * n / horizon), rel=1e-15)


def test_adaptive_zero_init_is_allowed_and_stays_zero() -> None:
    controller = AdaptiveKLController(init=0.0, target=1.0, horizon=10)
    controller.update(5.0, n_steps=10)
    assert controller.value == 0.0


@pytest.mark.parametrize(
    "init, target, horizon, key",
    [(-0.1, 6.0, 10.0, "init=-0.1"), (0.1, -1.0, 10.0, "target=-1.0"), (0.1, 6.0, 0.0, "horizon=0.0"),
     (0.1, 6.0, -5.0, "horizon=-5.0"), (math.inf, 6.0, 10.0, "init must be finite"),
     (0.1, math.nan, 10.0, "target must be finite"), (0.1, 6.0, math.inf, "horizon must be finite")],
)  # fmt: skip
def test_adaptive_rejects_bad_settings(init: float, target: float, horizon: float, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        AdaptiveKLController(init=init, target=target, horizon=horizon)


def test_adaptive_state_holds_only_the_coefficient() -> None:
    controller = AdaptiveKLController(init=0.05, target=6.0, horizon=10)
    controller.update(12.0, n_steps=10)
    assert controller.state_dict() == {"value": pytest.approx(0.06, rel=1e-15)}
    with pytest.raises(ValueError, match="state 'value' must be finite"):
        controller.load_state_dict({"value": float("inf")})


def test_adaptive_accepts_small_positive_target_and_horizon() -> None:
    controller = AdaptiveKLController(init=0.1, target=0.5, horizon=0.5)
    controller.update(1.0, n_steps=0)
    assert controller.value == 0.1
    controller.update(0.0, n_steps=0.5)  # e = -1 -> -0.2 over one horizon
    assert controller.value == pytest.approx(0.08, rel=1e-15)
