"""GAE on responses of one token (T = 1): the advantage is the one-step TD error r - V."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import gae


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_one_token_responses_give_reward_minus_value(gamma: float, lam: float) -> None:
    rewards = torch.tensor([[2.0], [-1.5], [4.0]], dtype=torch.float64)
    values = torch.tensor([[0.5], [0.25], [9.0]], dtype=torch.float64)
    mask = torch.tensor([[1], [1], [0]])
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    # the episode ends at its only token: no bootstrap, whatever gamma and lam
    assert advantages.tolist() == [[1.5], [-1.75], [0.0]]
    assert returns.tolist() == [[2.0], [-1.5], [0.0]]


def test_two_tokens_by_hand() -> None:
    rewards = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    gamma, lam = 0.9, 0.8
    advantages, returns = gae(rewards, values, torch.ones(1, 2), gamma, lam)
    a1 = 3.0 - 2.0  # last token: r - V
    a0 = (1.0 + gamma * 2.0 - 0.5) + gamma * lam * a1
    assert advantages[0].tolist() == pytest.approx([a0, a1], rel=1e-15)
    assert returns[0].tolist() == pytest.approx([a0 + 0.5, a1 + 2.0], rel=1e-15)


def test_gamma_and_lam_bounds_are_inclusive() -> None:
    ones = torch.ones(1, 2)
    for gamma, lam in ((0.0, 0.0), (1.0, 1.0)):
        gae(ones, ones, ones, gamma, lam)
    for gamma, lam in ((-0.1, 0.5), (1.1, 0.5), (0.5, -0.1), (0.5, 1.1)):
        with pytest.raises(ValueError, match="gamma and lam in"):
            gae(ones, ones, ones, gamma, lam)


def test_shape_errors_name_the_tensor() -> None:
    with pytest.raises(ValueError, match="expects \\[B, T\\]"):
        gae(torch.ones(3), torch.ones(3), torch.ones(3), 1.0, 1.0)
    with pytest.raises(ValueError, match="mask has shape"):
        gae(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 3), 1.0, 1.0)
