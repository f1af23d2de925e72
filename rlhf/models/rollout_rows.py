"""Rows of rollouts in the rollout layout (rlhf/models/sequences.py): pick rows, join rollouts of
different widths, and cut the columns that are padding in every row. DAPO's refilled groups and
`rlhf eval`'s length-sorted batches use them."""

from __future__ import annotations

import torch
from torch.nn.functional import pad

from rlhf.models.sampling import Rollout
from rlhf.models.sequences import trimmed


def select_rollout(rollout: Rollout, index: torch.Tensor) -> Rollout:
    """Rows `index` of a rollout (same columns)."""
    index = index.to(rollout.input_ids.device)
    return Rollout(
        input_ids=rollout.input_ids[index],
        attention_mask=rollout.attention_mask[index],
        prompt_length=rollout.prompt_length,
        response_mask=rollout.response_mask[index],
        ended_with_eos=rollout.ended_with_eos[index],
        logprobs=None if rollout.logprobs is None else rollout.logprobs[index],
        decode_steps=rollout.decode_steps,
    )


def concat_rollouts(rollouts: list[Rollout], pad_token_id: int = 0) -> Rollout:
    """Rollouts of different prompt and response widths as one, in the rollout layout: every prompt
    block left-padded to the widest, every response block right-padded to the longest (padding is
    masked: `pad_token_id` in the ids, 0 in the masks and log-probs). `decode_steps` add up."""
    if len(rollouts) == 1:
        return rollouts[0]
    p_max = max(r.prompt_length for r in rollouts)
    t_max = max(r.response_mask.shape[1] for r in rollouts)
    parts: dict[str, list[torch.Tensor]] = {"ids": [], "attn": [], "resp": [], "lp": []}
    for r in rollouts:
        left, right = p_max - r.prompt_length, t_max - r.response_mask.shape[1]
        parts["ids"].append(pad(r.input_ids, (left, right), value=pad_token_id))
        parts["attn"].append(pad(r.attention_mask, (left, right), value=0))
        parts["resp"].append(pad(r.response_mask, (0, right), value=0))
        if r.logprobs is not None:
            parts["lp"].append(pad(r.logprobs, (0, right), value=0.0))
    with_logprobs = all(r.logprobs is not None for r in rollouts)
    return Rollout(
        input_ids=torch.cat(parts["ids"]),
        attention_mask=torch.cat(parts["attn"]),
        prompt_length=p_max,
        response_mask=torch.cat(parts["resp"]),
        ended_with_eos=torch.cat([r.ended_with_eos for r in rollouts]),
        logprobs=torch.cat(parts["lp"]) if with_logprobs else None,
        decode_steps=sum(r.decode_steps for r in rollouts),
    )


def trim_rollout(rollout: Rollout) -> Rollout:
    """`rollout` without the prompt columns that are padding in every row (on the left) nor the
    response columns likewise (on the right; one kept), as `trimmed` cuts them; each row's tokens,
    masks and log-probs unchanged."""
    ids, attention, prompt_length = trimmed(rollout.input_ids, rollout.attention_mask, rollout.prompt_length)
    width = ids.shape[1] - prompt_length
    return Rollout(
        input_ids=ids,
        attention_mask=attention,
        prompt_length=prompt_length,
        response_mask=rollout.response_mask[:, :width],
        ended_with_eos=rollout.ended_with_eos,
        logprobs=None if rollout.logprobs is None else rollout.logprobs[:, :width],
        decode_steps=rollout.decode_steps,
    )
