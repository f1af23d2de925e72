"""DAPO's per-row pieces: which groups carry a signal (dynamic sampling) and the soft overlong
penalty (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476; docs/algorithms.md §35-§37).

Both are per-row functions over ``[B]`` tensors: no models, no sampling. The loop that refills a
batch with informative groups is rlhf/rl/dapo.py (`fill_with_informative`); the clip-higher bound is
``policy_loss("ppo", ..., clip_eps_high=...)`` (rlhf/core/losses.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


def informative_groups(scores: Tensor, group: Tensor, *, keep: Tensor | None = None) -> Tensor:
    """``[B]`` bool: True where the row's group has scores that are not all equal (DAPO paper §3.2,
    dynamic sampling: a group whose rewards are all equal has zero group-relative advantage and
    no gradient). A group of one row is not informative.

    keep: ``[B]`` bool, the rows that count (e.g. those a truncation policy kept); a row not kept
    is False and moves nothing, so a group informative only through a dropped row is not. None:
    every row counts. Computed and returned on `group`'s device.
    """
    if scores.dim() != 1 or group.shape != scores.shape:
        raise ValueError(
            f"informative_groups needs scores [B] and group [B], got {tuple(scores.shape)} and "
            f"{tuple(group.shape)}"
        )
    device = group.device  # the scores may be on the GPU and the group ids on the host
    kept = (
        torch.ones(scores.shape, dtype=torch.bool, device=device) if keep is None else keep.bool().to(device)
    )
    if kept.shape != scores.shape:
        raise ValueError(f"keep must be [B] = {tuple(scores.shape)}, got {tuple(kept.shape)}")
    if scores.numel() == 0:
        return kept.clone()
    _, index = torch.unique(group, return_inverse=True)
    size = int(index.max()) + 1
    values = scores.detach().double().to(device)
    # per group: the largest and smallest kept score (+inf / -inf fill for rows not kept)
    high = torch.full((size,), -torch.inf, dtype=values.dtype, device=values.device)
    low = torch.full((size,), torch.inf, dtype=values.dtype, device=values.device)
    high = high.scatter_reduce(0, index, torch.where(kept, values, -torch.inf), "amax")
    low = low.scatter_reduce(0, index, torch.where(kept, values, torch.inf), "amin")
    spread = high[index] > low[index]  # False for a group of one kept row or none
    return spread & kept


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int) -> Tensor:
    """``[B]`` float: DAPO's soft overlong punishment (DAPO paper §3.4, eq. 13) of responses with
    `lengths` tokens::

        0                                       if L <= max_length - buffer
        ((max_length - buffer) - L) / buffer    if max_length - buffer < L <= max_length
        -1                                      if L > max_length

    i.e. 0 up to ``max_length - buffer``, then linear down to -1 at `max_length`, -1 beyond. It is
    added to the response's reward. buffer 0: no ramp, 0 up to max_length and -1 beyond.
    """
    if max_length < 1:
        raise ValueError(f"overlong_penalty needs max_length >= 1, got {max_length}")
    if not 0 <= buffer <= max_length:
        raise ValueError(f"overlong_penalty needs 0 <= buffer <= max_length ({max_length}), got {buffer}")
    length = lengths.detach().to(torch.float32)
    start = float(max_length - buffer)
    ramp = (start - length) / buffer if buffer > 0 else torch.zeros_like(length)
    penalty = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_length, torch.full_like(length, -1.0), penalty)
