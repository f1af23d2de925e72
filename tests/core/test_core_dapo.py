"""DAPO's core pieces against plain Python loops and closed forms: informative_groups (dynamic
sampling), overlong_penalty (soft overlong punishment) and the PPO loss with clip-higher
(Yu et al. 2025, arXiv 2503.14476, DAPO paper §3.1, §3.2, §3.4)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlhf.core import informative_groups, overlong_penalty, policy_loss, ppo_loss


# --------------------------------------------------------------------------------------------
# informative_groups
# --------------------------------------------------------------------------------------------
def informative_loop(scores: list[float], group: list[int], keep: list[bool]) -> list[bool]:
    out = []
    for i in range(len(scores)):
        if not keep[i]:
            out.append(False)
            continue
        members = [scores[j] for j in range(len(scores)) if group[j] == group[i] and keep[j]]
        out.append(len(members) >= 2 and max(members) != min(members))
    return out


def test_informative_groups_closed_form() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert informative_groups(scores, group).tolist() == [False, False, True, True, False, False, False]


@pytest.mark.parametrize("seed", range(20))
def test_informative_groups_matches_a_plain_loop(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 24)
    group = [rng.randint(0, 6) * 7 - 3 for _ in range(n)]  # unsorted, negative and gapped ids
    scores = [float(rng.choice([0, 1])) if rng.random() < 0.7 else rng.random() for _ in range(n)]
    keep = [rng.random() < 0.8 for _ in range(n)]
    got = informative_groups(torch.tensor(scores), torch.tensor(group), keep=torch.tensor(keep))
    assert got.tolist() == informative_loop(scores, group, keep)
    plain = informative_groups(torch.tensor(scores), torch.tensor(group))
    assert plain.tolist() == informative_loop(scores, group, [True] * n)


def test_informative_groups_group_of_one_and_empty() -> None:
    assert informative_groups(torch.tensor([3.0]), torch.tensor([0])).tolist() == [False]
    assert informative_groups(torch.tensor([1.0, 2.0]), torch.tensor([0, 1])).tolist() == [False, False]
    empty = informative_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,) and empty.dtype == torch.bool


def test_informative_groups_never_reads_a_row_not_kept() -> None:
    group = torch.tensor([0, 0, 0, 1, 1])
    keep = torch.tensor([True, True, False, True, False])
    base = torch.tensor([1.0, 1.0, 0.0, 2.0, 5.0])
    garbage = base.clone()
    garbage[2], garbage[4] = float("nan"), float("inf")
    assert informative_groups(base, group, keep=keep).tolist() == [False] * 5  # the 0 was dropped
    assert informative_groups(garbage, group, keep=keep).tolist() == [False] * 5


def test_informative_groups_float_difference_counts() -> None:
    scores = torch.tensor([0.1, 0.1 + 1e-6], dtype=torch.float32)
    assert informative_groups(scores, torch.tensor([4, 4])).tolist() == [True, True]


def test_informative_groups_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="group"):
        informative_groups(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="keep"):
        informative_groups(
            torch.zeros(3), torch.zeros(3, dtype=torch.long), keep=torch.ones(2, dtype=torch.bool)
        )


# --------------------------------------------------------------------------------------------
# overlong_penalty
# --------------------------------------------------------------------------------------------
def penalty_loop(length: int, max_length: int, buffer: int) -> float:
    """DAPO paper eq. 13, written as the paper writes it."""
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / buffer
    return -1.0


@pytest.mark.parametrize(("max_length", "buffer"), [(20, 4), (20, 20), (7, 1), (16, 5), (5, 0)])
def test_overlong_penalty_matches_the_paper(max_length: int, buffer: int) -> None:
    lengths = list(range(0, max_length + 4))
    got = overlong_penalty(torch.tensor(lengths), max_length, buffer)
    assert got.dtype == torch.float32 and got.shape == (len(lengths),)
    for length, value in zip(lengths, got.tolist()):
        assert value == pytest.approx(penalty_loop(length, max_length, buffer), abs=1e-6), length


def test_overlong_penalty_landmarks() -> None:
    got = overlong_penalty(torch.tensor([12, 14, 16, 17, 100]), 16, 4).tolist()
    assert got == pytest.approx([0.0, -0.5, -1.0, -1.0, -1.0])
    assert overlong_penalty(torch.tensor([3]), 4, 2).tolist() == pytest.approx([-0.5])  # batch of one
    assert overlong_penalty(torch.zeros(0, dtype=torch.long), 4, 2).shape == (0,)


def test_overlong_penalty_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 4, 5)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 4, -1)
    with pytest.raises(ValueError, match="max_length"):
        overlong_penalty(torch.tensor([1]), 0, 0)


# --------------------------------------------------------------------------------------------
# clip-higher: ratio clipped to [1 - clip_eps, 1 + clip_eps_high]
# --------------------------------------------------------------------------------------------
def ppo_loop(logp, old, adv, mask, eps_low, eps_high):
    """Per token, in plain floats: (loss, clip_fraction, low, high)."""
    total, n, clipped_n, low_n, high_n = 0.0, 0, 0, 0, 0
    for lp_row, old_row, a_row, m_row in zip(logp, old, adv, mask):
        for lp, o, a, m in zip(lp_row, old_row, a_row, m_row):
            if not m:
                continue
            ratio = math.exp(lp - o)
            unclipped = -a * ratio
            clipped = -a * min(max(ratio, 1 - eps_low), 1 + eps_high)
            total += max(unclipped, clipped)
            n += 1
            if clipped > unclipped:
                clipped_n += 1
                low_n += a < 0
                high_n += a > 0
    if n == 0:
        return 0.0, 0.0, 0.0, 0.0
    return total / n, clipped_n / n, low_n / n, high_n / n


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(("eps", "eps_high"), [(0.2, 0.28), (0.2, None), (0.1, 0.05), (0.3, 0.3)])
def test_clip_higher_matches_a_plain_loop(seed: int, eps: float, eps_high: float | None) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = 1 + seed % 4
    logp = torch.randn(rows, 6, generator=g, dtype=torch.float64) * 0.3
    old = torch.randn(rows, 6, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, 6, generator=g) < 0.7).double()
    mask[0] = 0.0 if seed == 3 else mask[0]  # a fully masked row
    masked = mask == 0
    noisy = [t.masked_fill(masked, v) for t, v in ((logp, 1e9), (old, -1e9), (adv, float("nan")))]
    loss, stats = policy_loss("ppo", *noisy[:2], None, noisy[2], mask, clip_eps=eps, clip_eps_high=eps_high)
    high = eps if eps_high is None else eps_high
    expected = ppo_loop(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), eps, high)
    assert loss.item() == pytest.approx(expected[0], rel=1e-9, abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(expected[1], abs=1e-6)
    assert stats["clip_fraction_low"].item() == pytest.approx(expected[2], abs=1e-6)
    assert stats["clip_fraction_high"].item() == pytest.approx(expected[3], abs=1e-6)


def test_clip_higher_lets_a_positive_advantage_ratio_grow_further() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(1.25), math.log(0.75)]], dtype=torch.float64).requires_grad_()
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    loss, stats = ppo_loss(logp, old, None, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    # token 0: A > 0 and ratio 1.25 < 1.28, unclipped (symmetric 0.2 would clip it at 1.2)
    # token 1: A < 0 and ratio 0.75 < 0.8, clipped at the lower bound
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2, rel=1e-12)
    assert stats["clip_fraction"].item() == 0.5
    assert stats["clip_fraction_low"].item() == 0.5 and stats["clip_fraction_high"].item() == 0.0
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-1.25 / 2, rel=1e-12)  # d(-A r)/dlogp = -A r / n
    assert logp.grad[0, 1].item() == 0.0
    symmetric, sym_stats = ppo_loss(logp.detach(), old, None, adv, mask, clip_eps=0.2)
    assert symmetric.item() == pytest.approx((-1.2 + 0.8) / 2, rel=1e-12)
    assert sym_stats["clip_fraction_high"].item() == 0.5


def test_clip_eps_high_none_is_the_symmetric_clip() -> None:
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(3, 5, generator=g) for _ in range(3))
    mask = torch.ones(3, 5)
    a, sa = ppo_loss(logp, old, None, adv, mask, clip_eps=0.15)
    b, sb = ppo_loss(logp, old, None, adv, mask, clip_eps=0.15, clip_eps_high=0.15)
    assert a.item() == b.item() and all(sa[k].item() == sb[k].item() for k in sa)


def test_clip_eps_high_must_be_positive() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="clip_eps_high"):
        ppo_loss(x, x, None, x, torch.ones(1, 1), clip_eps_high=0.0)
