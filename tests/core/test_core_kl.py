"""KL estimators (exact expectations by enumeration) and the KL controllers (hand computation)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core import AdaptiveKLController, FixedKLController, kl_estimate


def test_estimators_match_their_formulas() -> None:
    d = [-3.0, -1.0, -1e-4, 0.0, 1e-4, 0.5, 2.0, 10.0]
    ref_logp = torch.full((1, len(d)), -2.0, dtype=torch.float64)
    logp = ref_logp + torch.tensor([d], dtype=torch.float64)
    assert kl_estimate(logp, ref_logp, "k1")[0].tolist() == pytest.approx(d, rel=1e-12)
    assert kl_estimate(logp, ref_logp, "k2")[0].tolist() == pytest.approx([x * x / 2 for x in d], rel=1e-12)
    expected_k3 = [math.exp(-x) - 1 + x for x in d]
    assert kl_estimate(logp, ref_logp, "k3")[0].tolist() == pytest.approx(expected_k3, rel=1e-6, abs=1e-15)
    assert kl_estimate(logp, ref_logp)[0].tolist() == pytest.approx(d, rel=1e-12)  # default k1


def categorical_cases() -> list[tuple[list[float], list[float]]]:
    cases = [([0.7, 0.2, 0.1], [0.1, 0.3, 0.6]), ([0.5, 0.5], [0.9, 0.1])]
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        p = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64) * 2, 0)
        q = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64) * 2, 0)
        cases.append((p.tolist(), q.tolist()))
    return cases


@pytest.mark.parametrize(("p", "q"), categorical_cases())
def test_k1_and_k3_are_unbiased_exactly(p: list[float], q: list[float]) -> None:
    """E_{x ~ p}[k(x)], computed by enumerating the categories with weights p, equals KL(p || q)."""
    true_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    logp = torch.tensor([p], dtype=torch.float64).log()
    ref_logp = torch.tensor([q], dtype=torch.float64).log()
    weights = torch.tensor(p, dtype=torch.float64)
    for kind in ("k1", "k3"):
        expectation = float((weights * kl_estimate(logp, ref_logp, kind)[0]).sum())
        assert expectation == pytest.approx(true_kl, rel=1e-10)
    k2_expectation = float((weights * kl_estimate(logp, ref_logp, "k2")[0]).sum())
    assert abs(k2_expectation - true_kl) > 1e-3  # k2 is biased: the test above can tell


def test_k1_is_negative_on_some_tokens_but_k3_is_not() -> None:
    logp, ref_logp = torch.tensor([[-2.0, -0.5]]), torch.tensor([[-0.5, -2.0]])
    assert kl_estimate(logp, ref_logp, "k1")[0, 0] < 0
    assert torch.all(kl_estimate(logp, ref_logp, "k3") > 0)


logprob = st.floats(-1e4, 0.0, allow_nan=False, width=32)
rows = st.lists(st.tuples(logprob, logprob), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(pairs=rows)
def test_k2_and_k3_are_never_negative(pairs: list[tuple[float, float]]) -> None:
    logp = torch.tensor([[a for a, _ in pairs]], dtype=torch.float32)
    ref_logp = torch.tensor([[b for _, b in pairs]], dtype=torch.float32)
    for kind in ("k2", "k3"):
        kl = kl_estimate(logp, ref_logp, kind)
        assert not torch.isnan(kl).any()
        assert torch.all(kl >= 0)


@settings(max_examples=200, deadline=None)
@given(d=st.floats(-80.0, 80.0, allow_nan=False, width=32))
def test_k3_is_never_negative_for_tiny_and_large_differences(d: float) -> None:
    kl = kl_estimate(torch.tensor([[d]]), torch.zeros(1, 1), "k3")
    assert kl.item() >= 0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_mask_zeroes_and_ignores_padding(kind: str, value: float) -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 5, generator=gen) * 3
    ref_logp = -torch.rand(3, 5, generator=gen) * 3
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    clean = kl_estimate(logp, ref_logp, kind, mask=mask)
    poisoned_logp = torch.where(mask.bool(), logp, value).requires_grad_(True)
    poisoned = kl_estimate(poisoned_logp, torch.where(mask.bool(), ref_logp, value), kind, mask=mask)
    assert torch.equal(clean, poisoned)
    assert torch.all(clean[mask == 0] == 0)
    assert torch.equal(clean[mask == 1], kl_estimate(logp, ref_logp, kind)[mask == 1])
    (grad,) = torch.autograd.grad(poisoned.sum(), poisoned_logp)
    assert torch.isfinite(grad).all() and torch.all(grad[mask == 0] == 0)


def test_kl_estimate_errors() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ref_logp has shape"):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 3))


# --- controllers ------------------------------------------------------------------------------


def test_fixed_controller_never_moves() -> None:
    controller = FixedKLController(0.05)
    for kl in (0.0, 100.0, -3.0):
        controller.update(kl, n_steps=64)
    assert controller.value == 0.05
    restored = FixedKLController(1.0)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.value == 0.05
    with pytest.raises(ValueError, match=">= 0"):
        FixedKLController(-0.1)


def test_adaptive_controller_matches_hand_computation() -> None:
    controller = AdaptiveKLController(init=0.1, target=6.0, horizon=100)
    controller.update(9.0, n_steps=10)  # e = 9/6 - 1 = 0.5, clipped to 0.2: beta * (1 + 0.2 * 0.1)
    assert controller.value == pytest.approx(0.1 * 1.02)
    controller.update(torch.tensor(3.0), n_steps=10)  # e = -0.5, clipped to -0.2
    assert controller.value == pytest.approx(0.1 * 1.02 * 0.98)
    controller.update(6.6, n_steps=20)  # e = 0.1 (inside the clip): * (1 + 0.1 * 0.2)
    assert controller.value == pytest.approx(0.1 * 1.02 * 0.98 * 1.02)
    controller.update(6.0, n_steps=50)  # on target: unchanged
    assert controller.value == pytest.approx(0.1 * 1.02 * 0.98 * 1.02)
    controller.update(0.0, n_steps=100)  # e = -1 -> -0.2 over a full horizon: * 0.8
    assert controller.value == pytest.approx(0.1 * 1.02 * 0.98 * 1.02 * 0.8)


def test_adaptive_controller_state_round_trip_and_errors() -> None:
    controller = AdaptiveKLController(init=0.05, target=6.0, horizon=10000)
    controller.update(12.0, n_steps=256)
    resumed = AdaptiveKLController(init=0.05, target=6.0, horizon=10000)
    resumed.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    controller.update(1.0, n_steps=256)
    resumed.update(1.0, n_steps=256)
    assert resumed.value == controller.value
    with pytest.raises(ValueError, match="n_steps=20000"):
        controller.update(1.0, n_steps=20000)
    with pytest.raises(ValueError, match="current_kl must be finite"):
        controller.update(float("nan"), n_steps=1)
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(init=0.05, target=0.0, horizon=10)
