"""Entropy of the full next-token distribution (a monitor, and the optional entropy bonus)."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``-sum_v p_v log p_v`` over the last dim of `logits` ``[..., V]``, shape ``[...]``.

    Computed from ``log_softmax`` (no overflow for large logits), in float32 at least. Logits of
    -inf (tokens removed by top-k/top-p filtering) contribute 0, with finite gradients. Rounding
    below 0 is clamped: the result is never negative.
    """
    if logits.dim() == 0:
        raise ValueError("entropy_from_logits expects logits [..., V], got a scalar")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    # p * log p is 0 where p = 0; replace log p = -inf first so neither forward nor backward is NaN.
    finite_logp = torch.where(torch.isneginf(logp), torch.zeros_like(logp), logp)
    entropy = -(logp.exp() * finite_logp).sum(dim=-1)
    return entropy.clamp_min(0.0)
