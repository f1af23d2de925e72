"""Generalized advantage estimation over response tokens (docs/algorithms.md#10-gae; PPO paper sec. 3.2.2; Schulman et al. 2016)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core._masks import as_bool_mask, check_same_shape, fill_masked


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Advantages and returns ``[B, T]`` by GAE, 0 at masked positions.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        G_t     = A_t + V_t

    The episode ends at the last valid token (the EOS): the value and advantage after it are 0.
    More generally a masked position ends the episode, so a right-padded row is one episode and a
    fully masked row gives zeros. lam = 0 gives the TD error, lam = 1 the discounted return minus V.
    Call it under ``torch.no_grad()`` (or with detached values) to get plain targets.
    """
    check_same_shape(rewards, "rewards", values=values)
    if rewards.dim() != 2:
        raise ValueError(f"gae expects [B, T] tensors, got shape {tuple(rewards.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae needs gamma and lam in [0, 1], got gamma={gamma}, lam={lam}")
    valid = as_bool_mask(mask, rewards, name="rewards")
    r, v = fill_masked(rewards, valid), fill_masked(values, valid)
    if r.shape[1] == 0:
        return torch.zeros_like(r), torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_advantage = torch.zeros_like(r[:, 0])
    reversed_advantages = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        advantage = fill_masked(delta + gamma * lam * next_advantage, valid[:, t])
        reversed_advantages.append(advantage)
        next_value, next_advantage = v[:, t], advantage  # both 0 at a masked position
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = fill_masked(advantages + v, valid)
    return advantages, returns
