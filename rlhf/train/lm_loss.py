"""Next-token cross-entropy on selected tokens: SFT, PPO-ptx and the reward model's imitation term.

Memory: the output head runs only on the hidden states of the scored positions, in chunks that
each reduce their logits to one log-prob per token (`rlhf.models.logprobs.logprobs_from_hidden`,
recomputed in the backward), so no [B, L, V] logits tensor, log-softmax copy or gradient of one
is ever alive: on a 49k vocabulary that was 0.8 GB per copy for 8 rows of 512 tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf.models.backbone import decoder_hidden_states, output_head
from rlhf.models.logprobs import logprobs_from_hidden


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Sum of -log p(token) over positions where `loss_mask` is 1, and their count, from whole logits.

    `logits[:, j]` predicts `input_ids[:, j + 1]`, so token j is scored by the logits at j - 1;
    the first token has no prediction and is never scored. (The trainers use `hidden_token_nll`,
    which never builds `logits`; this is its plain reference.)
    """
    target_mask = loss_mask[:, 1:].bool()
    count = int(target_mask.sum())
    if count == 0:
        return logits.sum() * 0.0, 0
    picked_logits = logits[:, :-1][target_mask]  # [N, V]: only the scored positions
    targets = input_ids[:, 1:][target_mask]
    nll = torch.nn.functional.cross_entropy(picked_logits.float(), targets, reduction="sum")
    return nll, count


def hidden_token_nll(
    model: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """`token_nll` of the logits `model`'s output head would give on `hidden` [B, L', H] (the decoder's
    states of columns 0 .. L' - 1, L' >= L - 1), without materializing them: the head runs on the
    N scored positions only, a chunk at a time (float32 log-softmax, as `token_nll`)."""
    target_mask = loss_mask[:, 1:].bool()
    count = int(target_mask.sum())
    if count == 0:  # a zero that still reaches the head and the decoder (every parameter in the graph)
        return output_head(model)(hidden[:, :1]).float().sum() * 0.0, 0
    picked = hidden[:, : target_mask.shape[1]][target_mask]  # [N, H]
    targets = input_ids[:, 1:][target_mask]
    logp, _ = logprobs_from_hidden(model, picked.unsqueeze(0), targets.unsqueeze(0))
    return -logp.sum(), count


def model_token_nll(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """`token_nll` of a causal LM on a right-padded batch (positions from the attention mask). The
    decoder stops one column short: the last column is only ever a target (exact under causal attention)."""
    hidden = decoder_hidden_states(model, input_ids[:, :-1], attention_mask[:, :-1])
    return hidden_token_nll(model, hidden, input_ids, loss_mask)


def sequence_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """The summed log-probs [B] (float32) of each right-padded row's response tokens (`response_mask`)
    under a causal LM: what DPO's losses take (docs/algorithms.md §32). Like `model_token_nll`, the
    head runs on the scored positions only; a row without a response token sums to 0."""
    hidden = decoder_hidden_states(model, input_ids[:, :-1], attention_mask[:, :-1])
    target_mask = response_mask[:, 1:].bool()
    sums = hidden.new_zeros(input_ids.shape[0], dtype=torch.float32)
    if not bool(target_mask.any()):  # a zero that still reaches the head and the decoder
        return sums + output_head(model)(hidden[:, :1]).float().sum() * 0.0
    picked = hidden[target_mask]  # [N, H], row-major: the rows' positions in order
    targets = input_ids[:, 1:][target_mask]
    logp, _ = logprobs_from_hidden(model, picked.unsqueeze(0), targets.unsqueeze(0))
    rows = target_mask.nonzero()[:, 0]
    return sums.index_add(0, rows, logp[0].float())
