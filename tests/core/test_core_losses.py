"""Policy losses (ppo, apa, awr), the value loss and entropy, against closed forms and plain loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core import (
    POLICY_LOSSES,
    entropy_from_logits,
    policy_loss,
    register_policy_loss,
    value_loss,
)

EPS = 0.2


def ppo_case(ratios: list[float], advantages: list[float]) -> tuple[torch.Tensor, ...]:
    """One row of tokens with given ratios exp(logp - old_logp) and advantages; logp is the leaf."""
    old_logp = torch.full((1, len(ratios)), -1.5, dtype=torch.float64)
    logp = (old_logp + torch.tensor([ratios], dtype=torch.float64).log()).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    return logp, old_logp, adv, torch.ones_like(adv)


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


def random_tokens(seed: int, batch: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn() -> torch.Tensor:
        return torch.randn(batch, width, generator=gen, dtype=torch.float64)

    lengths = torch.randint(1, width + 1, (batch,), generator=gen).tolist()
    lengths[-1] = 0  # a fully masked row
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).double()
    old_logp = -randn().abs() - 0.1
    return {
        "logp": (old_logp + 0.5 * randn()).requires_grad_(True),
        "old_logp": old_logp,
        "ref_logp": old_logp + 0.3 * randn(),
        "advantages": randn(),
        "mask": mask,
    }


def valid_positions(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]


# --- ppo --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ppo_inside_clip_range_is_minus_a_times_ratio(sign: float) -> None:
    ratios, advantages = [0.85, 1.0, 1.15], [sign * 2.0, sign * 0.5, sign * 1.0]
    logp, old_logp, adv, mask = ppo_case(ratios, advantages)
    loss, stats = policy_loss("ppo", logp, old_logp, None, adv, mask, clip_eps=EPS)
    assert loss.item() == pytest.approx(sum(-a * r for a, r in zip(advantages, ratios)) / 3, rel=1e-12)
    # d/dlogp of -A * exp(logp - old) / N = -A * ratio / N
    expected_grad = [-a * r / 3 for a, r in zip(advantages, ratios)]
    assert grad_of(loss, logp)[0].tolist() == pytest.approx(expected_grad, rel=1e-12)
    assert stats["clip_fraction"].item() == 0.0


@pytest.mark.parametrize(("ratio", "advantage"), [(1.5, 2.0), (0.5, -2.0)])
def test_ppo_clipped_side_has_zero_gradient(ratio: float, advantage: float) -> None:
    """A > 0 with ratio > 1 + eps, and A < 0 with ratio < 1 - eps: the clipped term, constant."""
    logp, old_logp, adv, mask = ppo_case([ratio], [advantage])
    loss, stats = policy_loss("ppo", logp, old_logp, None, adv, mask, clip_eps=EPS)
    clipped_ratio = 1 + EPS if advantage > 0 else 1 - EPS
    assert loss.item() == pytest.approx(-advantage * clipped_ratio, rel=1e-12)
    assert grad_of(loss, logp).item() == 0.0
    assert stats["clip_fraction"].item() == 1.0


@pytest.mark.parametrize(("ratio", "advantage"), [(0.5, 2.0), (1.5, -2.0)])
def test_ppo_pessimistic_side_outside_the_range_keeps_its_gradient(ratio: float, advantage: float) -> None:
    logp, old_logp, adv, mask = ppo_case([ratio], [advantage])
    loss, stats = policy_loss("ppo", logp, old_logp, None, adv, mask, clip_eps=EPS)
    assert loss.item() == pytest.approx(-advantage * ratio, rel=1e-12)
    assert grad_of(loss, logp).item() == pytest.approx(-advantage * ratio, rel=1e-12)
    assert stats["clip_fraction"].item() == 0.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("clip_eps", [0.1, 0.2])
def test_ppo_matches_loop(seed: int, clip_eps: float) -> None:
    data = random_tokens(seed)
    # row 0 gets A with the sign of log(ratio): its tokens with |ratio - 1| > eps are on the clipped side
    data["advantages"][0] = data["advantages"][0].abs() * (data["logp"] - data["old_logp"]).detach()[0].sign()
    loss, stats = policy_loss("ppo", **data, clip_eps=clip_eps)
    terms, clipped, kl3, ratios = [], [], [], []
    for b, t in valid_positions(data["mask"]):
        ratio = math.exp(data["logp"][b, t].item() - data["old_logp"][b, t].item())
        a = data["advantages"][b, t].item()
        unclipped_term, clipped_term = -a * ratio, -a * min(max(ratio, 1 - clip_eps), 1 + clip_eps)
        terms.append(max(unclipped_term, clipped_term))
        clipped.append(clipped_term > unclipped_term)
        kl3.append(ratio - 1 - math.log(ratio))
        ratios.append(ratio)
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(sum(clipped) / len(clipped))
    assert 0 < stats["clip_fraction"].item() < 1  # random case exercises both branches
    assert stats["approx_kl"].item() == pytest.approx(sum(kl3) / len(kl3), rel=1e-10)
    assert stats["ratio_mean"].item() == pytest.approx(sum(ratios) / len(ratios), rel=1e-12)
    assert stats["ratio_max"].item() == pytest.approx(max(ratios), rel=1e-12)
    assert stats["ratio_min"].item() == pytest.approx(min(ratios), rel=1e-12)


def test_ppo_dual_clip_caps_negative_advantages() -> None:
    c = 3.0
    # ratio 10, A < 0: -A * 10 = 20 > -c * A = 6 -> capped, zero gradient
    logp, old_logp, adv, mask = ppo_case([10.0], [-2.0])
    loss, stats = policy_loss("ppo", logp, old_logp, None, adv, mask, dual_clip=c)
    assert loss.item() == pytest.approx(6.0) and grad_of(loss, logp).item() == 0.0
    assert stats["dual_clip_fraction"].item() == 1.0
    loss_no_dual, _ = policy_loss("ppo", logp, old_logp, None, adv, mask)
    assert loss_no_dual.item() == pytest.approx(20.0)
    # ratio 2 < c: untouched; A > 0 never dual-clipped
    logp, old_logp, adv, mask = ppo_case([2.0, 10.0], [-2.0, 1.0])
    loss, stats = policy_loss("ppo", logp, old_logp, None, adv, mask, dual_clip=c)
    assert loss.item() == pytest.approx((4.0 + -1.0 * (1 + EPS)) / 2)
    assert stats["dual_clip_fraction"].item() == 0.0


def test_ppo_ratio_against_reference() -> None:
    data = random_tokens(11)
    loss_ref, stats_ref = policy_loss("ppo", **data, ratio_against="ref")
    swapped = dict(data, old_logp=data["ref_logp"])
    loss_swapped, _ = policy_loss("ppo", **swapped)
    assert loss_ref.item() == pytest.approx(loss_swapped.item(), rel=1e-12)
    other_old = dict(data, old_logp=data["old_logp"] - 5.0)
    assert policy_loss("ppo", **other_old, ratio_against="ref")[0].item() == loss_ref.item()
    assert loss_ref.item() != pytest.approx(policy_loss("ppo", **data)[0].item())
    _, stats_old = policy_loss("ppo", **data)
    assert stats_ref["approx_kl"].item() == stats_old["approx_kl"].item()  # always old vs new
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss("ppo", **dict(data, ref_logp=None), ratio_against="ref")
    with pytest.raises(ValueError, match="'old' or 'ref'"):
        policy_loss("ppo", **data, ratio_against="behaviour")


# --- apa, awr ---------------------------------------------------------------------------------


def test_apa_is_zero_with_zero_gradient_at_its_target() -> None:
    """Dyadic numbers and lam = 0.25 make logp - ref_logp - A/lam exactly 0 in floating point."""
    ref_logp = torch.tensor([[-0.5, -1.25, -3.0], [-2.0, -0.125, -7.0]])
    advantages = torch.tensor([[0.25, -0.5, 1.0], [0.0, 0.75, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logp = (ref_logp + advantages / 0.25).requires_grad_(True)
    loss, stats = policy_loss("apa", logp, None, ref_logp, advantages, mask, lam=0.25)
    assert loss.item() == 0.0 and stats["residual_abs_mean"].item() == 0.0
    assert torch.all(grad_of(loss, logp) == 0)
    loss_off, _ = policy_loss("apa", logp, None, ref_logp - 0.5, advantages, mask, lam=0.25)
    assert loss_off.item() == pytest.approx(0.25)  # off the target by 0.5 on every token


def test_apa_default_lam_target_up_to_rounding() -> None:
    data = random_tokens(2)
    target_logp = (data["ref_logp"] + data["advantages"] / 0.1).detach().requires_grad_(True)
    loss, _ = policy_loss("apa", **dict(data, logp=target_logp))  # lam defaults to 0.1
    assert loss.item() == pytest.approx(0.0, abs=1e-25)
    assert torch.allclose(grad_of(loss, target_logp), torch.zeros_like(target_logp), atol=1e-13)


@pytest.mark.parametrize("lam", [0.1, 1.0])
def test_apa_matches_loop(lam: float) -> None:
    data = random_tokens(3)
    loss, stats = policy_loss("apa", **data, lam=lam)
    positions = valid_positions(data["mask"])
    residuals = [
        data["logp"][b, t].item() - data["ref_logp"][b, t].item() - data["advantages"][b, t].item() / lam
        for b, t in positions
    ]
    assert loss.item() == pytest.approx(sum(r * r for r in residuals) / len(residuals), rel=1e-12)
    grad = grad_of(loss, data["logp"])
    for (b, t), r in zip(positions, residuals):
        assert grad[b, t].item() == pytest.approx(2 * r / len(residuals), rel=1e-12)
    assert stats["target_mean"].item() == pytest.approx(
        sum(data["advantages"][b, t].item() / lam for b, t in positions) / len(positions), rel=1e-12
    )
    with pytest.raises(ValueError, match="apa' needs ref_logp"):
        policy_loss("apa", **dict(data, ref_logp=None))


@pytest.mark.parametrize("max_weight", [None, 1.5])
def test_awr_matches_loop_and_respects_max_weight(max_weight: float | None) -> None:
    lam = 2.0
    data = random_tokens(5)
    data["advantages"] = (data["advantages"] * 3).requires_grad_(True)
    loss, stats = policy_loss("awr", **data, lam=lam, max_weight=max_weight)
    positions = valid_positions(data["mask"])
    raw = [math.exp(data["advantages"][b, t].item() / lam) for b, t in positions]
    weights = [w if max_weight is None else min(w, max_weight) for w in raw]
    terms = [-w * data["logp"][b, t].item() for w, (b, t) in zip(weights, positions)]
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    grad_logp, grad_adv = torch.autograd.grad(loss, [data["logp"], data["advantages"]], allow_unused=True)
    for w, (b, t) in zip(weights, positions):
        assert grad_logp[b, t].item() == pytest.approx(-w / len(weights), rel=1e-12)
    assert grad_adv is None  # weights are detached
    assert stats["weight_max"].item() == pytest.approx(max(weights), rel=1e-12)
    assert stats["weight_mean"].item() == pytest.approx(sum(weights) / len(weights), rel=1e-12)
    expected_clipped = 0.0 if max_weight is None else sum(w > max_weight for w in raw) / len(raw)
    assert stats["weight_clip_fraction"].item() == pytest.approx(expected_clipped)
    if max_weight is not None:
        assert stats["weight_max"].item() <= max_weight and expected_clipped > 0


def test_awr_max_weight_keeps_huge_advantages_finite() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = policy_loss(
        "awr", logp, None, None, torch.tensor([[1e4, 0.0]]), torch.ones(1, 2), max_weight=20.0
    )
    assert loss.item() == pytest.approx((20.0 * 1.0 + 1.0 * 2.0) / 2)
    assert stats["weight_clip_fraction"].item() == 0.5


# --- value loss -------------------------------------------------------------------------------


@pytest.mark.parametrize("clip_eps", [None, 0.2])
@pytest.mark.parametrize("seed", range(3))
def test_value_loss_matches_loop(clip_eps: float | None, seed: int) -> None:
    data = random_tokens(seed)
    old_values = data["old_logp"]
    values = (
        old_values
        + 0.4
        * torch.randn(old_values.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ).requires_grad_(True)
    returns = data["ref_logp"]
    loss, stats = value_loss(values, old_values, returns, data["mask"], clip_eps=clip_eps)
    positions = valid_positions(data["mask"])
    terms, clipped = [], []
    for b, t in positions:
        v, v_old, g = values[b, t].item(), old_values[b, t].item(), returns[b, t].item()
        unclipped = (v - g) ** 2
        if clip_eps is None:
            terms.append(unclipped)
            continue
        v_clip = v_old + min(max(v - v_old, -clip_eps), clip_eps)
        terms.append(max(unclipped, (v_clip - g) ** 2))
        clipped.append((v_clip - g) ** 2 > unclipped)
    assert loss.item() == pytest.approx(0.5 * sum(terms) / len(terms), rel=1e-12)
    expected_fraction = sum(clipped) / len(clipped) if clipped else 0.0
    assert stats["value_clip_fraction"].item() == pytest.approx(expected_fraction)
    if clip_eps is not None:
        assert 0 < expected_fraction < 1
    g = [returns[b, t].item() for b, t in positions]
    residual = [returns[b, t].item() - values[b, t].item() for b, t in positions]

    def var(xs: list[float]) -> float:
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)

    assert stats["explained_variance"].item() == pytest.approx(1 - var(residual) / var(g), rel=1e-10)
    assert stats["value_mean"].item() == pytest.approx(
        sum(values[b, t].item() for b, t in positions) / len(positions)
    )


def test_value_loss_clipped_gradient_closed_form() -> None:
    """V moved beyond the clip away from G: the clipped term is larger and constant -> no gradient."""
    values = torch.tensor([[1.5, 0.1]], requires_grad=True)
    old, returns = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    loss, stats = value_loss(values, old, returns, torch.ones(1, 2), clip_eps=0.2)
    # token 0: max(1.5^2, 1.2^2) = 2.25 (unclipped, gradient 1.5); token 1: max(0.81, 0.81) ties
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.81) / 2)
    assert grad_of(loss, values)[0, 0].item() == pytest.approx(0.5 * 2 * 1.5 / 2)
    values = torch.tensor([[0.5]], requires_grad=True)  # moved 0.5 towards G = 0 from 1.0: clipped at 0.8
    loss, stats = value_loss(
        values, torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), clip_eps=0.2
    )
    assert loss.item() == pytest.approx(0.5 * 0.64) and grad_of(loss, values).item() == 0.0
    assert stats["value_clip_fraction"].item() == 1.0
    with pytest.raises(ValueError, match="needs old_values"):
        value_loss(values, None, values, torch.ones(1, 1), clip_eps=0.2)
    assert value_loss(values, None, torch.tensor([[1.5]]), torch.ones(1, 1))[0].item() == pytest.approx(0.5)


# --- mask invariance and degenerate batches for every loss -------------------------------------


def all_losses(data: dict[str, torch.Tensor]) -> list[tuple[str, tuple[torch.Tensor, dict]]]:
    values = data["logp"]  # any differentiable [B, T] tensor serves as critic values here
    return [
        ("ppo", policy_loss("ppo", **data, dual_clip=3.0)),
        ("ppo_ref", policy_loss("ppo", **data, ratio_against="ref")),
        ("apa", policy_loss("apa", **data)),
        ("awr", policy_loss("awr", **data, max_weight=2.0)),
        ("value", value_loss(values, data["old_logp"], data["ref_logp"], data["mask"], clip_eps=0.2)),
    ]


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_masked_positions_change_no_loss_stat_or_gradient(poison: float) -> None:
    clean = random_tokens(9)
    valid = clean["mask"].bool()
    poisoned = {k: v if k == "mask" else torch.where(valid, v.detach(), poison) for k, v in clean.items()}
    poisoned["logp"].requires_grad_(True)
    for (name, (loss_c, stats_c)), (_, (loss_p, stats_p)) in zip(all_losses(clean), all_losses(poisoned)):
        assert torch.equal(loss_c, loss_p), name
        assert stats_c.keys() == stats_p.keys()
        for key in stats_c:
            assert torch.equal(stats_c[key], stats_p[key]), (name, key)
        grad_c, grad_p = grad_of(loss_c, clean["logp"]), grad_of(loss_p, poisoned["logp"])
        assert torch.equal(grad_c, grad_p), name
        assert torch.all(grad_p[~valid] == 0), name


def test_fully_masked_batch_gives_zero_loss_and_finite_stats() -> None:
    data = random_tokens(1)
    data["mask"] = torch.zeros_like(data["mask"])
    for name, (loss, stats) in all_losses(data):
        assert loss.item() == 0.0, name
        assert all(torch.isfinite(v) for v in stats.values()), name
        assert torch.all(grad_of(loss, data["logp"]) == 0), name


def test_batch_of_one_single_token() -> None:
    data = {k: v[:1, :1] for k, v in random_tokens(4).items()}
    data["logp"] = data["logp"].detach().requires_grad_(True)
    data["mask"] = torch.ones(1, 1, dtype=torch.float64)
    ratio = math.exp(data["logp"].item() - data["old_logp"].item())
    a = data["advantages"].item()
    loss, _ = policy_loss("ppo", **data)
    assert loss.item() == pytest.approx(max(-a * ratio, -a * min(max(ratio, 0.8), 1.2)))
    for name, (loss, stats) in all_losses(data):
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values()), name


# --- registry ---------------------------------------------------------------------------------


def test_registry_extension_and_errors() -> None:
    assert {"ppo", "apa", "awr"} <= set(POLICY_LOSSES)

    @register_policy_loss("test_reinforce")
    def reinforce(logp, old_logp, ref_logp, advantages, mask, *, scale: float = 1.0):  # type: ignore[no-untyped-def]
        return -(scale * advantages * logp * mask).sum() / mask.sum(), {}

    try:
        loss, _ = policy_loss(
            "test_reinforce",
            torch.tensor([[-1.0]]),
            None,
            None,
            torch.tensor([[2.0]]),
            torch.ones(1, 1),
            scale=3.0,
        )
        assert loss.item() == 6.0
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_reinforce")(reinforce)

        @register_policy_loss("test_reinforce", replace=True)
        def reinforce_positional(logp, old_logp, ref_logp, advantages, mask, scale=1.0):  # type: ignore[no-untyped-def]
            return -(scale * advantages * logp).sum(), {}

        loss, _ = policy_loss(
            "test_reinforce",
            torch.tensor([[-1.0]]),
            None,
            None,
            torch.tensor([[2.0]]),
            torch.ones(1, 1),
            scale=0.5,
        )
        assert loss.item() == 1.0
        with pytest.raises(ValueError, match="'test_reinforce' got a parameter it does not take: .*'lam'"):
            policy_loss(
                "test_reinforce", torch.zeros(1, 1), None, None, torch.zeros(1, 1), torch.ones(1, 1), lam=1.0
            )
    finally:
        POLICY_LOSSES.pop("test_reinforce")
    data = random_tokens(0)
    with pytest.raises(
        ValueError, match="unknown policy loss 'grpo': choose one of apa, awr, cispo, gspo, online_dpo, ppo"
    ):
        policy_loss("grpo", **data)
    with pytest.raises(
        ValueError, match="policy loss 'apa' got a parameter it does not take: .*keyword argument 'clip_eps'"
    ):
        policy_loss("apa", **data, clip_eps=0.2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss("ppo", **data, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_loss("ppo", **dict(data, advantages=torch.zeros(2, 2)))


# --- entropy ----------------------------------------------------------------------------------


def test_entropy_closed_forms() -> None:
    assert entropy_from_logits(torch.zeros(3, 7)).tolist() == pytest.approx([math.log(7)] * 3, rel=1e-6)
    assert entropy_from_logits(torch.tensor([[1e4, 0.0, -1e4]])).item() == 0.0  # one-hot, not negative
    assert entropy_from_logits(torch.tensor([[5e4, 5e4, 5e4]])).item() == pytest.approx(math.log(3), rel=1e-6)
    p = [0.5, 0.25, 0.25]
    logits = torch.tensor([p]).log() + 3.0
    assert entropy_from_logits(logits).item() == pytest.approx(-sum(x * math.log(x) for x in p), rel=1e-6)
    half = torch.tensor([[0.0, 0.0, float("-inf")]], dtype=torch.float16)
    assert entropy_from_logits(half).item() == pytest.approx(math.log(2), rel=1e-6)


def test_entropy_matches_loop_and_has_finite_gradients_with_filtered_tokens() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    entropy = entropy_from_logits(logits)
    assert entropy.shape == (2, 3)
    for index in [(0, 0), (1, 2)]:
        z = logits[index].tolist()
        norm = math.log(sum(math.exp(v) for v in z))
        expected = -sum(math.exp(v - norm) * (v - norm) for v in z)
        assert entropy[index].item() == pytest.approx(expected, rel=1e-12)
    filtered = torch.tensor([[1.0, 2.0, float("-inf"), float("-inf")]], requires_grad=True)
    (grad,) = torch.autograd.grad(entropy_from_logits(filtered).sum(), filtered)
    assert torch.isfinite(grad).all() and grad[0, 2:].tolist() == [0.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=12))
def test_entropy_is_never_negative_nor_above_log_v(row: list[float]) -> None:
    entropy = entropy_from_logits(torch.tensor([row])).item()
    assert 0.0 <= entropy <= math.log(len(row)) + 1e-5
