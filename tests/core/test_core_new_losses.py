"""GSPO, CISPO, the Clip-Cov/KL-Cov switch of the PPO loss and the loss units, against plain float64
loops (docs/algorithms.md §41-43): masks, garbage at padding, a batch of one, fully masked rows."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import loss_unit_count, policy_loss, policy_loss_unit

GARBAGE = 1e4  # at padded positions: any change there must change nothing


def scalar(t: torch.Tensor) -> float:
    """A tensor's value as a float, outside autograd (a loop's weights are constants)."""
    return float(t.detach())


def batch(seed: int = 0, rows: int = 4, width: int = 5, spread: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 - 0.1
    old = logp + (torch.rand(rows, width, generator=g, dtype=torch.float64) - 0.5) * spread
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    mask = torch.ones(rows, width, dtype=torch.float64)
    if rows > 1:
        mask[0, 3:] = 0  # padding
        mask[-1] = 0  # a fully masked row
    for t in (logp, old, adv):
        t[mask == 0] = GARBAGE
    return logp, old, adv, mask


def gspo_loop(logp, old, adv, mask, eps_low, eps_high):
    """Per row: A_i, s_i from plain sums over its valid tokens; the mean over rows with one."""
    total, rows = 0.0, 0
    for i in range(logp.shape[0]):
        idx = [t for t in range(logp.shape[1]) if mask[i, t] != 0]
        if not idx:
            continue
        rows += 1
        a = sum(adv[i, t] for t in idx) / len(idx)
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in idx) / len(idx))
        total = total + torch.maximum(-a * s, -a * s.clamp(1 - eps_low, 1 + eps_high))
    return total / rows if rows else torch.zeros((), dtype=torch.float64)


@pytest.mark.parametrize("spread", [0.0, 0.3, 3.0])  # ratios at 1, near 1, far beyond the clip
@pytest.mark.parametrize("eps_high", [None, 4e-4, 0.5])
def test_gspo_value_and_gradient_match_a_plain_loop(spread: float, eps_high: float | None) -> None:
    logp, old, adv, mask = batch(spread=spread)
    mine = logp.clone().requires_grad_(True)
    loss, stats = policy_loss("gspo", mine, old, None, adv, mask, clip_eps=3e-4, clip_eps_high=eps_high)
    loss.backward()
    loss = loss.detach()
    ref = logp.clone().requires_grad_(True)
    expected = gspo_loop(ref, old, adv, mask, 3e-4, 3e-4 if eps_high is None else eps_high)
    expected.backward()
    assert scalar(loss) == pytest.approx(scalar(expected), rel=1e-12, abs=1e-15)
    assert torch.allclose(mine.grad, ref.grad, rtol=1e-10, atol=1e-14)
    assert mine.grad[mask == 0].abs().max() == 0
    assert 0 <= scalar(stats["clip_fraction"]) <= 1


def test_gspo_gives_every_token_of_a_row_the_same_weight() -> None:
    logp, old, adv, mask = batch(spread=0.0)  # s_i = 1, inside the clip: dL/dlogp_t = -A_i / (n_i * rows)
    logp.requires_grad_(True)
    policy_loss("gspo", logp, old, None, adv, mask)[0].backward()
    n_rows = 3
    for i in range(3):
        idx = mask[i] != 0
        a_i = scalar(adv[i][idx].mean())
        assert torch.allclose(logp.grad[i][idx], torch.full((int(idx.sum()),), -a_i / (int(idx.sum()) * n_rows),
                                                            dtype=torch.float64))  # fmt: skip


def test_gspo_batch_of_one_and_fully_masked() -> None:
    logp, old, adv, mask = batch(rows=1)
    loss, _ = policy_loss("gspo", logp, old, None, adv, mask)
    assert scalar(loss) == pytest.approx(scalar(gspo_loop(logp, old, adv, mask, 3e-4, 3e-4)), rel=1e-12)
    empty = torch.zeros_like(mask)
    logp.requires_grad_(True)
    loss, stats = policy_loss("gspo", logp, old, None, adv, empty)
    loss.backward()
    assert scalar(loss) == 0 and logp.grad.abs().max() == 0 and scalar(stats["ratio_mean"]) == 0


def cispo_loop(logp, old, adv, mask, eps_low, eps_high):
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            r = math.exp(scalar(logp[i, t] - old[i, t]))  # the weight is a constant (stop-gradient)
            w = min(r, 1 + eps_high) if eps_low is None else min(max(r, 1 - eps_low), 1 + eps_high)
            total = total - w * adv[i, t] * logp[i, t]
            n += 1
    return total / n if n else torch.zeros((), dtype=torch.float64)


@pytest.mark.parametrize("eps_low", [None, 0.2])
def test_cispo_value_and_gradient_match_a_plain_loop(eps_low: float | None) -> None:
    logp, old, adv, mask = batch(spread=3.0)
    mine = logp.clone().requires_grad_(True)
    loss, stats = policy_loss("cispo", mine, old, None, adv, mask, clip_eps_high=0.5, clip_eps=eps_low)
    loss.backward()
    ref = logp.clone().requires_grad_(True)
    expected = cispo_loop(ref, old, adv, mask, eps_low, 0.5)
    expected.backward()  # w is a float in the loop: no gradient through it, as CISPO's stop-gradient
    assert scalar(loss) == pytest.approx(scalar(expected), rel=1e-12)
    assert torch.allclose(mine.grad, ref.grad, rtol=1e-10, atol=1e-14)
    assert mine.grad[mask == 0].abs().max() == 0
    assert scalar(stats["clip_fraction_high"]) > 0  # spread 3: some ratios above 1.5
    assert (scalar(stats["clip_fraction_low"]) > 0) == (eps_low is not None)


def test_cispo_keeps_every_token_in_the_gradient_where_ppo_drops_clipped_ones() -> None:
    logp = torch.tensor([[0.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)  # the first token's ratio e > 1.28
    adv, mask = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2)
    policy_loss("ppo", logp, old, None, adv, mask, clip_eps_high=0.28)[0].backward()
    assert logp.grad[0, 0] == 0  # PPO: clipped, no gradient
    logp.grad = None
    policy_loss("cispo", logp, old, None, adv, mask, clip_eps_high=0.28)[0].backward()
    assert scalar(logp.grad[0, 0]) == pytest.approx(-1.28 / 2)  # CISPO: the capped weight, kept


def test_cispo_needs_its_upper_bound_batch_of_one_and_fully_masked() -> None:
    logp, old, adv, mask = batch(rows=1)
    with pytest.raises(ValueError, match="clip_eps_high"):
        policy_loss("cispo", logp, old, None, adv, mask)
    assert scalar(policy_loss("cispo", logp, old, None, adv, mask, clip_eps_high=4.0)[0]) == pytest.approx(
        scalar(cispo_loop(logp, old, adv, mask, None, 4.0)), rel=1e-12
    )
    loss, _ = policy_loss("cispo", logp, old, None, adv, torch.zeros_like(mask), clip_eps_high=4.0)
    assert scalar(loss) == 0


def test_losses_declare_their_unit_and_counts_follow_it() -> None:
    assert [policy_loss_unit(n) for n in ("ppo", "apa", "awr", "cispo", "gspo")] == ["tokens"] * 4 + ["rows"]
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_unit_count(mask, "tokens") == 3 and loss_unit_count(mask, "rows") == 2
    assert loss_unit_count(torch.zeros(1, 2), "rows") == 0


def test_clip_cov_detaches_and_kl_cov_penalises_the_selected_tokens_only() -> None:
    logp, old, adv, mask = batch(spread=0.3)
    chosen = torch.zeros_like(mask)
    chosen[1, 2] = chosen[2, 0] = 1
    chosen[0, 4] = 1  # at padding: ignored
    plain = logp.clone().requires_grad_(True)
    base, _ = policy_loss("ppo", plain, old, None, adv, mask)
    base.backward()
    detached = logp.clone().requires_grad_(True)
    loss, stats = policy_loss("ppo", detached, old, None, adv, mask, cov_detach=chosen)
    loss.backward()
    assert scalar(loss) == pytest.approx(scalar(base), rel=1e-12)  # the value kept, the gradient cut
    keep = (chosen == 0) | (mask == 0)
    assert torch.equal(detached.grad[keep], plain.grad[keep])
    assert detached.grad[1, 2] == 0 and detached.grad[2, 0] == 0
    assert scalar(stats["cov_fraction"]) == pytest.approx(2 / int(mask.sum()))
    penalised = logp.clone().requires_grad_(True)
    loss, _ = policy_loss("ppo", penalised, old, None, adv, mask, cov_kl=chosen, cov_kl_coef=0.5)
    loss.backward()
    n = int(mask.sum())
    extra = 0.5 * (abs(scalar(logp[1, 2] - old[1, 2])) + abs(scalar(logp[2, 0] - old[2, 0]))) / n
    assert scalar(loss) == pytest.approx(scalar(base) + extra, rel=1e-12)
    for i, t in ((1, 2), (2, 0)):
        sign = math.copysign(1.0, scalar(logp[i, t] - old[i, t]))
        assert scalar(penalised.grad[i, t]) == pytest.approx(scalar(plain.grad[i, t]) + 0.5 * sign / n)
