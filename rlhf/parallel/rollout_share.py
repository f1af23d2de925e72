"""Sampling split between data-parallel ranks: each rank samples its share of the rows, and the shares
are joined into the whole batch's rollout on every rank (docs/distributed.md).

Every decode step draws one uniform per row of the whole batch and each rank uses its rows'
(`RowShare`), so a row's tokens do not depend on the rank. A rank whose rows ended early draws the
missing steps' uniforms (`skip_draws`), so every generator ends where one process's would; responses
are right-padded to the longest over the ranks (pad id, mask 0, log-prob 0).
"""

from __future__ import annotations

import torch

from rlhf.models.sampling import Rollout, RowShare, skip_draws
from rlhf.parallel.peers import Peers


def row_share(peers: Peers, batch_size: int) -> RowShare:
    """This rank's contiguous rows of a batch (the same shares as the no-grad forwards)."""
    rows = peers.rows(batch_size)
    return RowShare(rows.start, rows.stop, batch_size)


def join_rollouts(
    peers: Peers,
    mine: Rollout,
    share: RowShare,
    generator: torch.Generator | None,
    sampled: bool,
    pad_token_id: int,
) -> Rollout:
    """The whole batch's rollout from every rank's `mine` (its `share` of the rows), on every rank.
    `sampled`: the sampler drew uniforms (do_sample), so `generator` catches up with the longest share."""
    steps, width = (int(max(v)) for v in zip(*peers.gather((mine.decode_steps, mine.response_ids.shape[1]))))
    if sampled and steps > mine.decode_steps:
        skip_draws(generator, share.batch_size, steps - mine.decode_steps, mine.input_ids.device)
    extra = width - mine.response_ids.shape[1]
    prompt = mine.prompt_length
    response = _pad_columns(mine.response_ids, extra, pad_token_id)
    ids = torch.cat([mine.prompt_ids, response], dim=1)
    attention = torch.cat([mine.prompt_mask, _pad_columns(mine.attention_mask[:, prompt:], extra, 0)], dim=1)
    rows = share.batch_size
    logprobs = None
    if mine.logprobs is not None:
        logprobs = peers.gather_rows(_pad_columns(mine.logprobs, extra, 0.0), rows)
    ended = peers.gather_rows(mine.ended_with_eos.to(torch.int32), rows).bool()  # gloo: no bool tensors
    attention = peers.gather_rows(attention, rows)
    return Rollout(
        input_ids=peers.gather_rows(ids, rows),
        attention_mask=attention,
        prompt_length=prompt,
        response_mask=attention[:, prompt:].float(),
        ended_with_eos=ended,
        logprobs=logprobs,
        decode_steps=steps,
    )


def _pad_columns(block: torch.Tensor, extra: int, value: float) -> torch.Tensor:
    """`block` [B, T] with `extra` columns of `value` on the right."""
    if extra == 0:
        return block
    return torch.cat(
        [block, torch.full((block.shape[0], extra), value, dtype=block.dtype, device=block.device)], 1
    )
