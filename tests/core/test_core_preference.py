"""preference_loss against per-pair closed forms written out with `math`, gradients against the
analytic derivative, and the edges: batch of one, empty batch, bf16 inputs, bad arguments. SimPO is
reference-free: its references are None (zero in the closed forms) and its margin is shifted by
gamma."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import PREFERENCE_LOSSES, REFERENCE_FREE, preference_loss


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def by_hand(name: str, h: float, beta: float, eps: float, gamma: float = 0.0) -> float:
    if name == "sigmoid":
        return -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
    if name == "simpo":  # SimPO eq. 6, with cDPO's smoothing
        return -(1 - eps) * log_sigmoid(beta * h - gamma) - eps * log_sigmoid(-(beta * h - gamma))
    if name == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return ((1 - eps) * -log_sigmoid(beta * h) + eps * log_sigmoid(-beta * h)) / (1 - 2 * eps)


def batch(b: int = 6, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(-20 * torch.rand(b, generator=g)).to(dtype) for _ in range(4)]


def inputs(name: str, b: int = 6, seed: int = 0, dtype=torch.float64):
    """(policy's chosen, rejected, reference's chosen, rejected, the references passed): a
    reference-free loss gets None, and its closed form zeros."""
    c, r, rc, rr = batch(b, seed, dtype)
    if name in REFERENCE_FREE:
        zero = torch.zeros_like(c)
        return c, r, zero, zero, (None, None)
    return c, r, rc, rr, (rc, rr)


@pytest.mark.parametrize("name", PREFERENCE_LOSSES)
@pytest.mark.parametrize("beta,eps", [(0.1, 0.0), (0.5, 0.2), (2.0, 0.1)])
def test_loss_and_stats_equal_the_per_pair_closed_form(name, beta, eps):
    c, r, rc, rr, refs = inputs(name)
    gamma = 0.7 if name in REFERENCE_FREE else 0.0
    loss, stats = preference_loss(name, c, r, *refs, beta=beta, label_smoothing=eps, gamma=gamma)
    hs = [(c[i] - rc[i] - (r[i] - rr[i])).item() for i in range(len(c))]
    expected = sum(by_hand(name, h, beta, eps, gamma) for h in hs) / len(hs)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    chosen = [beta * (c[i] - rc[i]).item() for i in range(len(c))]
    rejected = [beta * (r[i] - rr[i]).item() for i in range(len(c))]
    assert stats["chosen_reward"].item() == pytest.approx(sum(chosen) / len(c))
    assert stats["rejected_reward"].item() == pytest.approx(sum(rejected) / len(c))
    assert stats["margin"].item() == pytest.approx((sum(chosen) - sum(rejected)) / len(c))
    assert stats["accuracy"].item() == pytest.approx(sum(a > b for a, b in zip(chosen, rejected)) / len(c))
    assert stats["chosen_logp"].item() == pytest.approx(c.mean().item())
    assert stats["rejected_logp"].item() == pytest.approx(r.mean().item())
    assert all(not v.requires_grad for v in stats.values())


@pytest.mark.parametrize("name", PREFERENCE_LOSSES)
def test_gradient_equals_the_analytic_derivative(name):
    beta, eps, gamma = 0.3, 0.1, (0.4 if name in REFERENCE_FREE else 0.0)
    c, r, rc, rr, refs = inputs(name, b=5, seed=1)
    c.requires_grad_(True)
    r.requires_grad_(True)
    loss, _ = preference_loss(name, c, r, *refs, beta=beta, label_smoothing=eps, gamma=gamma)
    loss.backward()
    h = (c - rc - (r - rr)).detach()
    s = torch.sigmoid(beta * h - gamma)
    if name in ("sigmoid", "simpo"):  # d/dh of -(1-e) log s(bh - g) - e log s(-(bh - g))
        dh = -(1 - eps) * beta * (1 - s) + eps * beta * s
    elif name == "ipo":
        dh = 2 * (h - 1 / (2 * beta))
    else:
        dh = (-(1 - eps) * beta * (1 - s) - eps * beta * s) / (1 - 2 * eps)
    torch.testing.assert_close(c.grad, dh / len(h))
    torch.testing.assert_close(r.grad, -dh / len(h))


def test_the_three_agree_where_they_should():
    c, r, rc, rr = batch()
    plain, _ = preference_loss("sigmoid", c, r, rc, rr, beta=0.2)
    robust0, _ = preference_loss("robust", c, r, rc, rr, beta=0.2, label_smoothing=0.0)
    torch.testing.assert_close(plain, robust0)  # no noise: robust DPO is DPO
    # IPO is zero where the margin reaches 1 / (2 beta)
    h = torch.full((3,), 1 / (2 * 0.25), dtype=torch.float64)
    zero = torch.zeros(3, dtype=torch.float64)
    ipo, _ = preference_loss("ipo", h, zero, zero, zero, beta=0.25)
    assert ipo.item() == pytest.approx(0.0, abs=1e-12)
    # DPO at a zero margin is log 2, whatever beta
    dpo, stats = preference_loss("sigmoid", zero, zero, zero, zero, beta=3.0)
    assert dpo.item() == pytest.approx(math.log(2))
    assert stats["accuracy"].item() == 0.0  # ties do not count as correct
    # SimPO without a margin is DPO with a zero reference; its margin gamma is DPO's at h - gamma / beta
    simpo, _ = preference_loss("simpo", c, r, None, None, beta=0.2)
    zero6 = torch.zeros_like(c)
    torch.testing.assert_close(simpo, preference_loss("sigmoid", c, r, zero6, zero6, beta=0.2)[0])
    shifted, _ = preference_loss("simpo", c, r, None, None, beta=0.2, gamma=0.5)
    torch.testing.assert_close(
        shifted, preference_loss("sigmoid", c - 0.5 / 0.2, r, zero6, zero6, beta=0.2)[0]
    )


def test_batch_of_one_and_empty_batch():
    c, r, rc, rr = batch(b=1)
    loss, stats = preference_loss("sigmoid", c, r, rc, rr)
    h = (c - rc - (r - rr)).item()
    assert loss.item() == pytest.approx(by_hand("sigmoid", h, 0.1, 0.0))
    empty = torch.zeros(0, requires_grad=True)
    loss, stats = preference_loss("robust", empty, empty, empty, empty, label_smoothing=0.1)
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())
    loss.backward()  # a zero loss that still backpropagates (a rank with no pair joins the step)
    assert empty.grad is not None and empty.grad.numel() == 0
    loss, stats = preference_loss("simpo", empty, empty, None, None, gamma=0.5)
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())
    c, r, _, _ = batch(b=1)
    loss, _ = preference_loss("simpo", c, r, None, None, beta=2.0, gamma=1.0)
    assert loss.item() == pytest.approx(by_hand("simpo", (c - r).item(), 2.0, 0.0, 1.0))


def test_bf16_inputs_give_float32_math():
    c, r, rc, rr = batch(dtype=torch.bfloat16)
    loss, stats = preference_loss("sigmoid", c, r, rc, rr)
    assert loss.dtype == torch.float32 and stats["margin"].dtype == torch.float32
    expected, _ = preference_loss("sigmoid", *(t.float() for t in (c, r, rc, rr)))
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "kto"}, "unknown preference loss 'kto'"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"name": "robust", "label_smoothing": 0.5}, "robust needs 0 <= label_smoothing < 0.5"),
        ({"label_smoothing": -0.1}, r"label_smoothing must be in \[0, 1\]"),
        (
            {"gamma": 0.5},
            "gamma is SimPO's target margin: >= 0 for simpo, 0 otherwise; got 0.5 for 'sigmoid'",
        ),
        ({"name": "simpo", "refs": None, "gamma": -0.1}, "gamma is SimPO's target margin"),
        ({"name": "simpo", "refs": None, "gamma": math.nan}, "gamma is SimPO's target margin"),
        ({"name": "simpo"}, "preference loss 'simpo' takes no reference log-probs"),
        ({"refs": None}, "preference loss 'sigmoid' takes the reference's log-probs"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    c, r, rc, rr = batch()
    name = kwargs.pop("name", "sigmoid")
    refs = (None, None) if kwargs.pop("refs", True) is None else (rc, rr)
    with pytest.raises(ValueError, match=match):
        preference_loss(name, c, r, *refs, **kwargs)


def test_shapes_must_agree():
    c, r, rc, rr = batch()
    with pytest.raises(ValueError, match="four \\[B\\] tensors of one shape"):
        preference_loss("sigmoid", c, r[:3], rc, rr)
    with pytest.raises(ValueError, match="four \\[B\\] tensors"):
        preference_loss("sigmoid", *(t.view(2, 3) for t in (c, r, rc, rr)))
