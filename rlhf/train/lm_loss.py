"""Next-token cross-entropy on selected tokens: SFT, PPO-ptx and the reward model's imitation term."""

from __future__ import annotations

import torch

from rlhf.models.logprobs import position_ids


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Sum of -log p(token) over positions where `loss_mask` is 1, and their count.

    `logits[:, j]` predicts `input_ids[:, j + 1]`, so token j is scored by the logits at j - 1;
    the first token has no prediction and is never scored.
    """
    target_mask = loss_mask[:, 1:].bool()
    count = int(target_mask.sum())
    if count == 0:
        return logits.sum() * 0.0, 0
    picked_logits = logits[:, :-1][target_mask]  # [N, V]: only the scored positions
    targets = input_ids[:, 1:][target_mask]
    nll = torch.nn.functional.cross_entropy(picked_logits.float(), targets, reduction="sum")
    return nll, count


def model_token_nll(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """`token_nll` of a causal LM on a right-padded batch (positions from the attention mask)."""
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,  # a loss forward: no KV cache to build (and none under gradient checkpointing)
    ).logits
    return token_nll(logits, input_ids, loss_mask)
