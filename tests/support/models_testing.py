"""Batch builders and controlled models for the models-layer tests (tests.support.models_testing)."""

from __future__ import annotations

import torch
from torch import nn


def left_pad(
    rows: list[list[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
    return ids, mask


def right_pad(
    rows: list[list[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def rollout_batch(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int, prompt_width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(input_ids, attention_mask, P) in the rollout layout: left-padded prompts | right-padded responses."""
    p_ids, p_mask = left_pad(prompts, pad_id, prompt_width)
    r_ids, r_mask = right_pad(responses, pad_id)
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), p_ids.shape[1]


def fixed_logits_lm(lm: nn.Module, logits: torch.Tensor) -> nn.Module:
    """Make `lm` output the same next-token `logits` [V] at every position: the final norm is zeroed
    (hidden = 0) and the LM head replaced by a zero-weight Linear whose bias is `logits`."""
    lm.model.norm.weight.data.zero_()
    head = nn.Linear(lm.config.hidden_size, logits.numel(), bias=True)
    head.weight.data.zero_()
    head.bias.data.copy_(logits)
    lm.lm_head = head
    return lm
