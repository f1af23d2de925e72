"""Loss settings at their bounds: each rejected value names itself, each allowed small value works
as its formula says (checked by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import apa_loss, awr_loss, ppo_loss, value_loss

ONE = torch.ones(1, 2)


@pytest.mark.parametrize(
    "call, message",
    [(lambda: apa_loss(ONE, None, ONE, ONE, ONE, lam=0.0), "apa lam must be > 0, got 0.0"),
     (lambda: apa_loss(ONE, None, ONE, ONE, ONE, lam=-1.0), "apa lam must be > 0, got -1.0"),
     (lambda: awr_loss(ONE, None, None, ONE, ONE, lam=0.0), "awr lam must be > 0"),
     (lambda: awr_loss(ONE, None, None, ONE, ONE, max_weight=0.0), "awr max_weight must be > 0"),
     (lambda: ppo_loss(ONE, ONE, None, ONE, ONE, clip_eps=0.0), "ppo clip_eps must be > 0"),
     (lambda: ppo_loss(ONE, ONE, None, ONE, ONE, dual_clip=1.0), "ppo dual_clip must be > 1"),
     (lambda: value_loss(ONE, ONE, ONE, ONE, clip_eps=0.0), "value clip_eps must be > 0"),
     (lambda: value_loss(ONE, None, ONE, ONE, clip_eps=0.2), "needs old_values"),
     (lambda: value_loss(ONE, None, torch.ones(1, 3), ONE), "returns has shape \\(1, 3\\)"),
     (lambda: value_loss(ONE, torch.ones(2, 2), ONE, ONE), "old_values has shape \\(2, 2\\)"),
     (lambda: value_loss(ONE, None, ONE, torch.ones(2, 1)), "mask has shape \\(2, 1\\)"),
     (lambda: awr_loss(ONE, None, None, torch.ones(1, 3), ONE), "advantages has shape"),
     (lambda: apa_loss(ONE, None, torch.ones(2, 2), ONE, ONE), "ref_logp has shape")],
)  # fmt: skip
def test_bad_settings_and_shapes_name_the_fix(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_awr_cap_below_one() -> None:
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.0, -4.0]], dtype=torch.float64)  # weights exp(0 / 2) = 1, exp(-2)
    loss, stats = awr_loss(logp, None, None, adv, torch.ones(1, 2), lam=2.0, max_weight=0.5)
    weights = [0.5, math.exp(-2.0)]  # the first is capped at 0.5
    assert loss.item() == pytest.approx(-(weights[0] * -1.0 + weights[1] * -2.0) / 2, rel=1e-15)
    assert stats["weight_clip_fraction"].item() == 0.5 and stats["weight_max"].item() == 0.5
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0].tolist() == pytest.approx([-w / 2 for w in weights], rel=1e-15)


def test_small_positive_settings_are_allowed() -> None:
    apa, _ = apa_loss(torch.tensor([[0.5]]), None, torch.zeros(1, 1), torch.tensor([[0.05]]), torch.ones(1, 1),
                      lam=0.1)  # fmt: skip
    assert apa.item() == pytest.approx(0.0, abs=1e-12)  # logp - ref = A / lam exactly
    ppo, _ = ppo_loss(
        torch.zeros(1, 1), torch.zeros(1, 1), None, torch.ones(1, 1), torch.ones(1, 1), clip_eps=0.5
    )
    assert ppo.item() == -1.0
    value, _ = value_loss(torch.tensor([[3.0]]), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                          clip_eps=0.5)  # fmt: skip
    assert value.item() == 4.5  # max((3 - 0)^2, (0.5 - 0)^2) / 2
