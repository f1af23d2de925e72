"""What to do with a response that hit the length limit without EOS (docs/algorithms.md#5-truncated-responses):
unhandled, it is scored as if complete (docs/algorithms.md §25, point 8)."""

from __future__ import annotations

from typing import Literal

import torch

TruncationPolicy = Literal["keep", "penalize", "drop"]


def apply_truncation_policy(
    scores: torch.Tensor,
    ended_with_eos: torch.Tensor,
    policy: TruncationPolicy = "keep",
    penalty: float = -1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [B], keep_mask [B] bool) for the reward-model scores of a rollout.

    - "keep": scores unchanged, every sample kept;
    - "penalize": the score of every truncated sample is replaced by `penalty`, all kept;
    - "drop": scores unchanged, keep_mask False on truncated samples (the trainer leaves them out).
    """
    if scores.shape != ended_with_eos.shape:
        raise ValueError(
            f"scores {tuple(scores.shape)} and ended_with_eos {tuple(ended_with_eos.shape)} must both be [B]."
        )
    ended = ended_with_eos.bool()
    keep_all = torch.ones_like(ended)
    if policy == "keep":
        return scores, keep_all
    if policy == "penalize":
        return torch.where(ended, scores, torch.full_like(scores, penalty)), keep_all
    if policy == "drop":
        return scores, ended.clone()
    raise ValueError(f"truncation policy must be 'keep', 'penalize' or 'drop', got {policy!r}.")
