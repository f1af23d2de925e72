"""Online DPO's math (rlhf/core/online_dpo.py) against plain float64 loops: the pairwise estimator's
signs (ties, unpaired and fully masked rows), the pair loss and its slope per row, and the online_dpo
policy loss, whose gradient on padded per-token log-probs is the pair loss's."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import estimate_advantages, pair_preference, policy_loss, preference_pairs


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return math.exp(log_sigmoid(x))


def by_hand(name: str, h: float, beta: float, eps: float) -> tuple[float, float]:
    """(the pair's loss, its derivative in h), DPO / IPO / robust DPO written out."""
    if name == "sigmoid":
        loss = -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
        return loss, -(1 - eps) * beta * sigmoid(-beta * h) + eps * beta * sigmoid(beta * h)
    if name == "ipo":
        return (h - 1 / (2 * beta)) ** 2, 2 * (h - 1 / (2 * beta))
    loss = ((1 - eps) * -log_sigmoid(beta * h) + eps * log_sigmoid(-beta * h)) / (1 - 2 * eps)
    return loss, (-(1 - eps) * beta * sigmoid(-beta * h) - eps * beta * sigmoid(beta * h)) / (1 - 2 * eps)


# 9 rows: groups 0-1 decisive pairs, 2 a tie, 3 a pair whose second row is fully masked, 4 one row
SCORES = [1.0, 3.0, 0.5, -2.0, 2.0, 2.0, 4.0, 7.0, 1.0]
GROUP = [0, 0, 1, 1, 2, 2, 3, 3, 4]
LENGTHS = [3, 1, 4, 2, 2, 3, 2, 0, 4]  # valid tokens of each row (right-padded to 4)
EXPECTED_SIGN = [-1, 1, 1, -1, 0, 0, 0, 0, 0]


def rows(seed: int = 0):
    """(mask [9, 4], logp, ref_logp [9, 4] float64 with garbage at padding, group [9])."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in LENGTHS], dtype=torch.float64)
    logp = -3 * torch.rand(9, 4, generator=g, dtype=torch.float64)
    ref = -3 * torch.rand(9, 4, generator=g, dtype=torch.float64)
    garbage = 1e6 * (1 - mask)  # never read
    return mask, logp + garbage, ref - garbage, torch.tensor(GROUP)


def token_rewards(mask: torch.Tensor) -> torch.Tensor:
    """Each row's score at its last valid token (the KL-free token rewards of the preset)."""
    rewards = torch.zeros_like(mask)
    for i, n in enumerate(LENGTHS):
        if n:
            rewards[i, n - 1] = SCORES[i]
    return rewards


def test_the_pairwise_estimator_signs_each_pair_and_zeroes_ties_and_lone_rows():
    mask, _, _, group = rows()
    advantages, returns = estimate_advantages("pairwise", token_rewards(mask), mask, group=group)
    for i, n in enumerate(LENGTHS):
        assert advantages[i, :n].tolist() == [float(EXPECTED_SIGN[i])] * n
        assert advantages[i, n:].abs().sum() == 0  # 0 at padding
    assert torch.equal(advantages, returns)
    one = torch.ones(1, 3)  # a batch of one: no partner, no signal
    assert estimate_advantages("pairwise", one, one, group=torch.tensor([0]))[0].abs().sum() == 0
    chosen, rejected = preference_pairs(torch.tensor(EXPECTED_SIGN, dtype=torch.float64), group)
    assert chosen.tolist() == [1, 2] and rejected.tolist() == [0, 3]


@pytest.mark.parametrize("name,beta,eps", [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("ipo", 0.3, 0.0),
                                           ("robust", 0.2, 0.1)])  # fmt: skip
def test_the_pair_loss_and_each_rows_slope_equal_a_float64_loop(name, beta, eps):
    mask, logp, ref, group = rows()
    sums, ref_sums = (logp * mask).sum(1), (ref * mask).sum(1)
    sign = torch.tensor(EXPECTED_SIGN, dtype=torch.float64)
    loss, stats, slope = pair_preference(name, sums, ref_sums, sign, group, beta, eps)
    expected_loss, expected_slope, margins = 0.0, [0.0] * 9, []
    pairs = [(1, 0), (2, 3)]  # (chosen, rejected): the higher score chosen
    for c, r in pairs:
        s = [sum(logp[i, t].item() - ref[i, t].item() for t in range(LENGTHS[i])) for i in (c, r)]
        value, d = by_hand(name, s[0] - s[1], beta, eps)
        expected_loss += value / len(pairs)
        expected_slope[c], expected_slope[r] = d / len(pairs), -d / len(pairs)
        margins.append(beta * (s[0] - s[1]))
    assert loss.item() == pytest.approx(expected_loss, rel=1e-10)
    assert slope.tolist() == pytest.approx(expected_slope, rel=1e-10, abs=1e-12)
    assert stats["margin"].item() == pytest.approx(sum(margins) / 2, rel=1e-10)
    assert stats["accuracy"].item() == sum(m > 0 for m in margins) / 2 and stats["pairs"].item() == 2
    # no pair at all (every row a tie or alone): zeros, never NaN
    loss, stats, slope = pair_preference(name, sums, ref_sums, torch.zeros(9), group, beta, eps)
    assert loss.item() == 0 and slope.abs().sum() == 0 and stats["pairs"].item() == 0


def test_the_online_dpo_loss_has_the_pair_losss_gradient_for_any_split_of_the_rows():
    mask, logp, ref, group = rows()
    sign = torch.tensor(EXPECTED_SIGN, dtype=torch.float64)
    # the pair loss itself, differentiated through the padded per-token log-probs
    direct = logp.clone().requires_grad_(True)
    sums = (torch.where(mask.bool(), direct, 0.0)).sum(1)
    chosen, rejected = preference_pairs(sign, group)
    ref_sums = (ref * mask).sum(1)
    from rlhf.core import preference_loss

    loss, _ = preference_loss(
        "sigmoid", sums[chosen], sums[rejected], ref_sums[chosen], ref_sums[rejected], 0.1
    )
    (expected,) = torch.autograd.grad(loss, direct)
    # the gradient form: A_i = -N dL/dS_i, the loss a mean over the N rows with a valid token
    _, _, slope = pair_preference("sigmoid", sums.detach(), ref_sums, sign, group, 0.1, 0.0)
    n = int((mask.sum(1) > 0).sum())
    advantages = (-n * slope)[:, None] * mask
    for parts in ([list(range(9))], [[0, 5, 8], [1, 2, 3, 4], [6, 7]], [[i] for i in range(9)]):
        mine = logp.clone().requires_grad_(True)
        total = 0.0
        for part in parts:
            index = torch.tensor(part)
            value, stats = policy_loss("online_dpo", mine[index], logp[index].detach(), None,
                                       advantages[index], mask[index])  # fmt: skip
            assert value.item() == 0.0 and stats["approx_kl"].item() == pytest.approx(0.0, abs=1e-12)
            rows_here = int((mask[index].sum(1) > 0).sum())
            total = total + value * rows_here / n  # the trainer's row share of each micro-batch
        (got,) = torch.autograd.grad(total, mine)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        assert got[7].abs().sum() == 0 and got[mask == 0].abs().sum() == 0  # masked row and padding
