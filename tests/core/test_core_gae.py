"""GAE against a plain loop and its closed forms (lam = 0: TD error; lam = 1: return minus value)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import gae


def loop_gae(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """One episode (the valid prefix of a row); V after the last token is 0."""
    advantages = [0.0] * len(rewards)
    next_value, next_advantage = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        advantages[t] = delta + gamma * lam * next_advantage
        next_value, next_advantage = values[t], advantages[t]
    return advantages, [a + v for a, v in zip(advantages, values)]


def random_batch(seed: int, batch: int = 5, width: int = 7) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, width + 1, (batch,), generator=gen).tolist()
    lengths[:3] = [width, 1, 0]  # always a full row, a single-token row and a fully masked row
    return rewards, values, lengths


def mask_of(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).double()


def test_hand_made_case() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # deltas: t2 = 1 + 0 - 0.5 = 0.5, t1 = 0 + 0.5 - 0.5 = 0, t0 = 0; A = [0.125, 0.25, 0.5]
    assert advantages.tolist() == [[0.125, 0.25, 0.5, 0.0]]
    assert returns.tolist() == [[0.625, 0.75, 1.0, 0.0]]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("gamma", "lam"), [(1.0, 0.95), (0.99, 1.0), (1.0, 0.0), (0.0, 0.5), (0.0, 0.0), (1.0, 1.0), (0.5, 0.3)]
)
def test_matches_plain_loop(seed: int, gamma: float, lam: float) -> None:
    rewards, values, lengths = random_batch(seed)
    advantages, returns = gae(rewards, values, mask_of(lengths, rewards.shape[1]), gamma, lam)
    for b, length in enumerate(lengths):
        expected_adv, expected_ret = loop_gae(
            rewards[b, :length].tolist(), values[b, :length].tolist(), gamma, lam
        )
        padding = [0.0] * (rewards.shape[1] - length)
        assert advantages[b].tolist() == pytest.approx(expected_adv + padding, rel=1e-12, abs=1e-12)
        assert returns[b].tolist() == pytest.approx(expected_ret + padding, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_lam_one_is_discounted_return_minus_value(gamma: float) -> None:
    rewards, values, lengths = random_batch(7)
    advantages, returns = gae(rewards, values, mask_of(lengths, rewards.shape[1]), gamma, lam=1.0)
    for b, length in enumerate(lengths):
        for t in range(length):
            discounted_return = sum(gamma ** (k - t) * rewards[b, k].item() for k in range(t, length))
            assert returns[b, t].item() == pytest.approx(discounted_return, rel=1e-12, abs=1e-12)
            assert advantages[b, t].item() == pytest.approx(
                discounted_return - values[b, t].item(), rel=1e-12, abs=1e-12
            )


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_lam_zero_is_td_error(gamma: float) -> None:
    rewards, values, lengths = random_batch(8)
    advantages, _ = gae(rewards, values, mask_of(lengths, rewards.shape[1]), gamma, lam=0.0)
    for b, length in enumerate(lengths):
        for t in range(length):
            next_value = values[b, t + 1].item() if t + 1 < length else 0.0
            td_error = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            assert advantages[b, t].item() == pytest.approx(td_error, rel=1e-12, abs=1e-12)


def test_single_token_row_batch_of_one() -> None:
    advantages, returns = gae(
        torch.tensor([[2.0, 7.0]]), torch.tensor([[0.5, 7.0]]), torch.tensor([[1, 0]]), 1.0, 0.95
    )
    assert advantages.tolist() == [[1.5, 0.0]] and returns.tolist() == [[2.0, 0.0]]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e30])
def test_mask_invariance_and_fully_masked_row(value: float) -> None:
    rewards, values, lengths = random_batch(4)
    mask = mask_of(lengths, rewards.shape[1])
    clean = gae(rewards, values, mask, 1.0, 0.95)
    poisoned_values = torch.where(mask.bool(), values, value).requires_grad_(True)
    poisoned = gae(torch.where(mask.bool(), rewards, value), poisoned_values, mask, 1.0, 0.95)
    for a, b in zip(clean, poisoned):
        assert torch.equal(a, b)
        assert torch.all(b[mask == 0] == 0)
    assert torch.equal(poisoned[0][2], torch.zeros(rewards.shape[1], dtype=rewards.dtype))  # fully masked row
    (grad,) = torch.autograd.grad(poisoned[1].sum(), poisoned_values)
    assert torch.isfinite(grad).all() and torch.all(grad[mask == 0] == 0)


def test_float32_and_errors() -> None:
    advantages, returns = gae(torch.ones(2, 3), torch.zeros(2, 3), torch.ones(2, 3), 1.0, 1.0)
    assert advantages.dtype == torch.float32 and advantages.tolist() == [[3.0, 2.0, 1.0]] * 2
    assert torch.equal(returns, advantages)
    with pytest.raises(ValueError, match="gamma and lam in"):
        gae(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), 1.5, 0.9)
    with pytest.raises(ValueError, match="values has shape"):
        gae(torch.ones(1, 2), torch.ones(1, 3), torch.ones(1, 2), 1.0, 0.9)
    empty = gae(torch.ones(2, 0), torch.ones(2, 0), torch.ones(2, 0), 1.0, 0.9)
    assert empty[0].shape == (2, 0)


def test_a_masked_position_inside_a_row_is_skipped() -> None:
    """A hole in the mask (an environment's reply between two policy turns) is no time step: the
    row is ONE episode over its valid positions, the last token before the hole bootstrapping from
    the first after it (docs/algorithms.md#39-multi-turn-episodes); the hole gets 0 and its reward
    and value (here 5.0 and 9.0) are never read."""
    rewards = torch.tensor([[1.0, 2.0, 5.0, 3.0, 4.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 1.5, 9.0, 2.5, 3.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    a, g = loop_gae([1.0, 2.0, 3.0, 4.0], [0.5, 1.5, 2.5, 3.5], 0.9, 0.8)
    assert advantages[0].tolist() == pytest.approx(a[:2] + [0.0] + a[2:], rel=1e-12)
    assert returns[0].tolist() == pytest.approx(g[:2] + [0.0] + g[2:], rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_rows_with_holes_equal_a_plain_loop_over_their_valid_tokens(seed: int) -> None:
    """Random masks with holes and padding: each row's advantages and returns on its valid tokens
    are a plain loop's over those tokens alone (gathered, holes removed); 0 elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    values = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 9, generator=gen) < 0.6).double()
    mask[0] = 0.0  # a fully masked row
    mask[1, :] = 0.0
    mask[1, 4] = 1.0  # one valid token between masked ones
    advantages, returns = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    for b in range(6):
        index = mask[b].nonzero().flatten()
        a, g = loop_gae(rewards[b, index].tolist(), values[b, index].tolist(), 0.95, 0.9)
        assert advantages[b, index].tolist() == pytest.approx(a, rel=1e-10, abs=1e-12)
        assert returns[b, index].tolist() == pytest.approx(g, rel=1e-10, abs=1e-12)
        assert not advantages[b][mask[b] == 0].any() and not returns[b][mask[b] == 0].any()
