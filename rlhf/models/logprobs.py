"""Log-probabilities (and entropies) of response tokens given prompt + response.

Layout (docs/internals.md): `input_ids` [B, P + T] is a left-padded prompt block then a right-padded
response block; the log-prob of response token t is read from the logits at column P - 1 + t. The
logits are divided by the sampling temperature, so the behaviour policy's and the trained policy's
log-probs come from this one function and the first PPO ratio is exactly 1 (docs/algorithms.md §25,
point 10). The output head runs only on the T response columns, a chunk at a time, each chunk's
[B, t, V] logits reduced to [B, t] and recomputed in the backward: one chunk of logits alive at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlhf.models.backbone import causal_lm_parts, decoder_hidden_states, output_head, position_ids

__all__ = ["position_ids", "response_logprobs", "logprobs_from_hidden", "default_chunk_size"]

# Vocabulary-sized elements materialized per chunk (float32: 64 MiB).
LOGITS_CHUNK_ELEMENTS = 1 << 24


def default_chunk_size(batch_size: int, vocab_size: int) -> int:
    """Response columns per chunk so that a chunk of logits holds about `LOGITS_CHUNK_ELEMENTS`."""
    return max(1, LOGITS_CHUNK_ELEMENTS // max(1, batch_size * vocab_size))


def _vocab_size(model: nn.Module) -> int:
    head = causal_lm_parts(model)[1]
    return int(getattr(head, "out_features", 0) or head.weight.shape[0])


def _check_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> None:
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both "
            "be [B, P + T]."
        )
    if not 1 <= prompt_length <= input_ids.shape[1]:
        raise ValueError(
            f"prompt_length must be in [1, {input_ids.shape[1]}] (the prompt block's width P), got {prompt_length}."
        )


def _forward_terms(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool, with_probs: bool
):
    """log softmax(z / T)[target] [B, t] and, as asked, the entropy H [B, t] (else empty), the
    probabilities p [B, t, V] and, with H, the clamped scaled logits and E_p[s] [B, t] (else None).
    Banned tokens (z = -inf) count as the lowest finite logit, so that p_j s_j is 0, not NaN."""
    scaled = logits / temperature if temperature != 1.0 else logits
    log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)
    logp = scaled.gather(-1, targets.unsqueeze(-1)).sub_(log_norm).squeeze(-1)
    entropy, probs, finite, mean_scaled = logp.new_empty(0), None, None, None
    if with_entropy or with_probs:
        finite = scaled.clamp(min=torch.finfo(scaled.dtype).min)  # a new tensor: never the caller's
        probs = torch.sub(finite, log_norm).exp_()
    if with_entropy:
        mean_scaled = torch.linalg.vecdot(probs, finite)
        entropy = log_norm.squeeze(-1) - mean_scaled
    return logp, entropy, probs, finite, mean_scaled


class _TokenLogprobEntropy(torch.autograd.Function):
    """`_forward_terms` with a hand-written backward.

    Autograd's graph of `logsumexp` + `gather` (+ `softmax` for H) walks the vocabulary-sized
    block about a dozen times in the backward; here the probabilities saved from the forward give
    the gradient in three passes:
        d logp / d s_j = 1[j = target] - p_j,      d H / d s_j = -p_j (s_j - sum_i p_i s_i),
    with s = z / T and the chain rule's 1/T at the end."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy, entropy_grad):
        logp, entropy, probs, finite, mean_scaled = _forward_terms(
            logits, targets, temperature, with_entropy, with_probs=True
        )
        ctx.temperature = temperature
        ctx.entropy_grad = with_entropy and entropy_grad
        if ctx.entropy_grad:
            ctx.save_for_backward(probs, targets, finite, mean_scaled)
        else:
            ctx.save_for_backward(probs, targets)
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        saved = ctx.saved_tensors  # read once (activation checkpointing allows one unpack)
        probs, targets = saved[:2]
        grad = probs * grad_logp.neg().unsqueeze(-1)
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        if ctx.entropy_grad and grad_entropy is not None and grad_entropy.numel():
            finite, mean_scaled = saved[2:]
            spread = torch.sub(finite, mean_scaled.unsqueeze(-1)).mul_(probs).mul_(grad_entropy.unsqueeze(-1))
            grad.sub_(spread)
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad, None, None, None, None


def _chunk_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for one chunk: [B, t, H] -> two [B, t] (entropy empty if not asked)."""
    logits = head(hidden).float()
    if not logits.requires_grad:  # no backward: no probabilities to keep unless H is asked
        return _forward_terms(logits, targets, temperature, with_entropy, with_probs=False)[:2]
    return _TokenLogprobEntropy.apply(logits, targets, temperature, with_entropy, entropy_grad)


def logprobs_from_hidden(
    model: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply `model`'s output head to `hidden` [B, T, H] chunk by chunk and return the log-prob of
    `targets` [B, T] under softmax(logits / temperature), and optionally that distribution's entropy."""
    batch, steps = targets.shape
    if steps == 0:
        empty = hidden.new_zeros(batch, 0, dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    if chunk_size is None:
        chunk_size = default_chunk_size(batch, _vocab_size(model))
    head = output_head(model)
    recompute = torch.is_grad_enabled() and steps > chunk_size
    logps, entropies = [], []
    for start in range(0, steps, chunk_size):
        h, y = hidden[:, start : start + chunk_size], targets[:, start : start + chunk_size]
        if recompute:
            logp, entropy = checkpoint(
                _chunk_logprobs, head, h, y, temperature, with_entropy, entropy_grad, use_reentrant=False
            )
        else:
            logp, entropy = _chunk_logprobs(head, h, y, temperature, with_entropy, entropy_grad)
        logps.append(logp)
        entropies.append(entropy)
    logp = torch.cat(logps, dim=1)
    return logp, (torch.cat(entropies, dim=1) if with_entropy else None)


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] of the response tokens `input_ids[:, P:]`, and their entropies [B, T] or None.

    One forward of the decoder over prompt + response but its last column; the head runs on the
    hidden states of columns P-1 .. P+T-2 only.
    `temperature` must be the sampling temperature. Padded response positions
    (`attention_mask[:, P:] == 0`) hold 0 in both outputs: callers mask them anyway.
    `entropy_grad=False` returns the entropy without a gradient (when it is only monitored).
    """
    _check_layout(input_ids, attention_mask, prompt_length)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (the sampling temperature), got {temperature}.")
    targets = input_ids[:, prompt_length:]
    if targets.shape[1] == 0:  # no response column
        empty = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
        return empty, (empty.clone() if with_entropy else None)
    # The last column only ever is a target: the decoder stops one column short (exact under causal
    # attention, and 1/(P+T) of the forward and backward saved).
    hidden = decoder_hidden_states(model, input_ids[:, :-1], attention_mask[:, :-1])
    logp, entropy = logprobs_from_hidden(
        model, hidden[:, prompt_length - 1 :], targets, temperature, with_entropy, chunk_size, entropy_grad
    )
    valid = attention_mask[:, prompt_length:].bool()
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if entropy is not None:
        entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    return logp, entropy
