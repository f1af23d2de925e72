"""Experience: one rollout batch with everything the update needs, as plain tensors.

The rollout layout (docs/internals.md): `input_ids [B, P+T]` is a left-padded prompt block
followed by a right-padded response block; per-token tensors are `[B, T]` over the response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from rlhf.data.length_grouping import micro_batch_groups
from rlhf.models.decoding import is_fsdp_sharded
from rlhf.models.precision import Precision
from rlhf.models.sequences import Sequences, trimmed
from rlhf.train.micro_batches import split_rows


@dataclass
class Experience:
    input_ids: torch.Tensor  # [B, P+T] long
    attention_mask: torch.Tensor  # [B, P+T] long
    prompt_length: int  # P: columns of the prompt block
    response_mask: torch.Tensor  # [B, T] float, 1 on real response tokens (EOS included)
    old_logp: torch.Tensor  # [B, T] behaviour policy log-probs (at the sampling temperature)
    ref_logp: torch.Tensor  # [B, T] reference log-probs
    old_values: torch.Tensor  # [B, T] critic values at sampling time
    advantages: torch.Tensor  # [B, T] GAE advantages (0 at padding)
    returns: torch.Tensor  # [B, T] value targets (0 at padding)
    group: torch.Tensor  # [B] long: rows sampled from one prompt share an id (rollout.samples_per_prompt)
    # [B, T] decoupled PPO's weight of each token, pi_prox / pi_behav truncated (docs/algorithms.md
    # §34), for rollouts sampled by an older policy (rollout.max_staleness); None: 1 everywhere
    is_weights: torch.Tensor | None = None
    # [B, T] 0/1: the tokens Clip-Cov / KL-Cov selected in this minibatch (docs/algorithms.md §43), set by
    # the policy's step (policy.cov_control); None: 0 everywhere
    cov_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.is_weights is None:
            self.is_weights = torch.ones_like(self.response_mask)
        if self.cov_mask is None:
            self.cov_mask = torch.zeros_like(self.response_mask)

    @classmethod
    def of(cls, sequences: Sequences, response_mask: torch.Tensor, **per_token: torch.Tensor) -> Experience:
        """The experience of a rollout's `sequences` with its response mask and per-token tensors."""
        return cls(
            input_ids=sequences.input_ids,
            attention_mask=sequences.attention_mask,
            prompt_length=sequences.prompt_length,
            response_mask=response_mask,
            **per_token,
        )

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def sequences(self) -> Sequences:
        return Sequences(self.input_ids, self.attention_mask, self.prompt_length)

    @property
    def num_tokens(self) -> float:
        return float(self.response_mask.sum())

    def to(self, device: torch.device | str) -> Experience:
        """The same experience with every tensor on `device`."""
        moved: dict[str, Any] = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
            for f in fields(self)
            if f.name != "prompt_length"
        }
        return Experience(prompt_length=self.prompt_length, **moved)

    def select(self, index: torch.Tensor) -> Experience:
        """Rows `index`, with columns that are padding in every selected row trimmed away."""
        picked = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "prompt_length"}
        picked = {k: v if v is None else v[index] for k, v in picked.items()}
        prompt_mask = picked["attention_mask"][:, : self.prompt_length]
        lead_columns = (prompt_mask.sum(0) == 0).long().cumprod(0).sum()  # all-padding prompt columns
        used = picked["response_mask"].sum(0) > 0
        columns = torch.arange(used.shape[0], device=used.device)
        last_used = torch.where(used, columns, -1).max()  # -1: no response column is used
        # both read in one transfer (each read is a host-device sync on a GPU)
        lead, last = torch.stack([lead_columns, last_used]).tolist()
        width = last + 1 if last >= 0 else 1  # all-padding response columns trimmed (one kept)
        out = {}
        for k, v in picked.items():
            if k in ("input_ids", "attention_mask"):
                out[k] = v[:, lead : self.prompt_length + width]
            elif v is None or v.dim() == 1:  # per-row
                out[k] = v
            else:
                out[k] = v[:, :width]
        return Experience(prompt_length=self.prompt_length - lead, **out)

    def lengths(self) -> list[int]:
        """Each row's real tokens (prompt + valid response): what micro-batches are cut by."""
        return (self.attention_mask[:, : self.prompt_length].sum(1) + self.response_mask.sum(1)).tolist()

    def take(self, index: list[int]) -> Experience:
        """Rows `index` (`select`): the engine's view of a batch (rlhf/train/micro_batches.py `Rows`)."""
        return self.select(torch.tensor(index, dtype=torch.long))

    def filler(self) -> Experience:
        """Its first row with the response mask zeroed: a micro-batch that runs every forward and
        backward a real one runs and weighs nothing (a data-parallel rank's padding, rlhf/train/micro_batches.py)."""
        row = self.select(torch.tensor([0]))
        row.response_mask = torch.zeros_like(row.response_mask)
        return row

    def minibatches(
        self, count: int, generator: torch.Generator, *, whole_groups: bool = False
    ) -> Iterator[Experience]:
        """`count` shuffled minibatches covering every row once (sizes differ by at most one); with
        `whole_groups`, the groups are shuffled and split instead, so the rows of a group stay together."""
        if not whole_groups:
            order = torch.randperm(self.batch_size, generator=generator)
            for chunk in torch.tensor_split(order, count):
                if len(chunk):
                    yield self.select(chunk)
            return
        ids, index = torch.unique(self.group.cpu(), return_inverse=True)
        for chunk in torch.tensor_split(torch.randperm(len(ids), generator=generator), count):
            rows = torch.isin(index, chunk).nonzero().squeeze(1)
            if len(rows):
                yield self.select(rows)

    def micro_batches(self, size: int, by_length: bool = False) -> Iterator[Experience]:
        """Micro-batches of `size` rows, each trimmed of its all-padding columns (`select`). With
        `by_length`, the rows are taken longest first (real prompt + valid response tokens), so
        rows of similar length share a micro-batch; the token-weighted sum over micro-batches
        (docs/algorithms.md §18) is the same whatever the grouping, up to float summation order."""
        for group in micro_batch_groups(self.lengths(), size, by_length):
            yield self.take(group)


def valid_tokens(rows: Experience) -> float:
    """A micro-batch's valid tokens: its weight in a token mean is their share of the step's
    (docs/algorithms.md §18; rlhf/train/learner.py `Learner.step`)."""
    return rows.num_tokens


def concat_experiences(batches: list[Experience]) -> Experience:
    """Join rollout batches of different prompt/response widths (the experience buffer)."""
    if len(batches) == 1:
        return batches[0]
    p_max = max(b.prompt_length for b in batches)
    t_max = max(b.response_mask.shape[1] for b in batches)
    padded = []
    for b in batches:
        left = p_max - b.prompt_length
        right = t_max - b.response_mask.shape[1]
        seq = {
            k: torch.nn.functional.pad(getattr(b, k), (left, right), value=0)
            for k in ("input_ids", "attention_mask")
        }
        tok = {
            f.name: torch.nn.functional.pad(getattr(b, f.name), (0, right), value=0)
            for f in fields(b)
            if f.name not in ("input_ids", "attention_mask", "prompt_length", "group")
        }
        padded.append(replace(b, prompt_length=p_max, **seq, **tok))
    joined = {
        f.name: torch.cat([getattr(b, f.name) for b in padded])
        for f in fields(Experience)
        if f.name not in ("prompt_length", "group")
    }
    return Experience(prompt_length=p_max, **joined, group=distinct_groups(batches))


def distinct_groups(batches: list[Experience]) -> torch.Tensor:
    """The batches' group ids joined, each batch's shifted past the previous ones (a group never
    spans two rollouts)."""
    joined, offset = [], 0
    for b in batches:
        joined.append(b.group - int(b.group.min()) + offset if len(b.group) else b.group)
        offset = int(joined[-1].max()) + 1 if len(b.group) else offset
    return torch.cat(joined)


def map_row_chunks(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    rows: int,
    by_length: bool = False,
    pad_to: int | None = None,
    tokens: int | None = None,
) -> torch.Tensor:
    """`fn(input_ids, attention_mask, prompt_length) -> [b, ...]` on chunks of `rows` rows, each
    `trimmed`, joined in the rows' order; per-token outputs are padded back to `pad_to` columns.
    `by_length`: rows of similar length (real tokens) share a chunk, longest first
    (rlhf.data.length_grouping); `tokens` (`train.micro_batch_tokens`): chunks cut by that token
    budget instead, as the training passes are (`split_rows`, the one place that decides how rows
    share a pass); each row's result is the same up to float rounding."""
    groups = split_rows(attention_mask.sum(1).tolist(), rows, by_length, tokens)
    outputs = []
    for group in groups:
        index = torch.tensor(group, dtype=torch.long, device=input_ids.device)
        out = fn(*trimmed(input_ids[index], attention_mask[index], prompt_length))
        if pad_to is not None:
            out = torch.nn.functional.pad(out, (0, pad_to - out.shape[1]), value=0.0)
        outputs.append(out)
    joined = torch.cat(outputs)
    order = [i for group in groups for i in group]
    if order == list(range(len(order))):
        return joined
    restored = torch.empty_like(joined)
    restored[torch.tensor(order, dtype=torch.long, device=joined.device)] = joined  # the rows' own order
    return restored


def forward_in_chunks(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    response_width: int,
    rows: int,
    by_length: bool = False,
    tokens: int | None = None,
) -> torch.Tensor:
    """Apply a per-response-token function in row chunks (bounded memory), padding outputs back to [B, T].

    `fn(input_ids, attention_mask, prompt_length) -> [b, t]`; each chunk is trimmed of columns that
    are padding in all of its rows, so short prompts and responses cost no compute for long ones;
    `by_length`: chunks of rows of similar length; `tokens`: chunks by a token budget (`map_row_chunks`).
    """
    return map_row_chunks(
        fn, input_ids, attention_mask, prompt_length, rows, by_length, pad_to=response_width, tokens=tokens
    )


def scoring_budget(tokens: int | None, module: torch.nn.Module) -> int | None:
    """The token budget of a role's no-grad forwards: `train.micro_batch_tokens`, or None (the row
    count) for a module sharded per layer by FSDP2. There every rank must run as many forwards (each
    gathers its layers, a collective): the runtime evens the ranks' rows (`Peers.padded_share`), and a
    budget would cut each rank's rows into a different number of chunks."""
    return None if tokens is None or is_fsdp_sharded(module) else tokens


class RowCutting(Protocol):
    """How a role cuts a batch's rows into forwards (a Learner's attributes, or a frozen role's
    `Scoring`)."""

    @property
    def micro_batch_size(self) -> int: ...
    @property
    def by_length(self) -> bool: ...
    @property
    def micro_batch_tokens(self) -> int | None: ...


@dataclass(frozen=True)
class Scoring:
    """A frozen role's no-grad forwards: `micro_batch_size` rows each (train.micro_batch_size),
    longest first with `by_length` (runtime.sort_by_length), or cut by a `micro_batch_tokens` budget
    (train.micro_batch_tokens), under `precision`'s autocast."""

    micro_batch_size: int
    precision: Precision | None = None
    by_length: bool = True
    micro_batch_tokens: int | None = None


def scored_in_chunks(
    fn: Callable[[Sequences], torch.Tensor],
    sequences: Sequences,
    cutting: RowCutting,
    module: torch.nn.Module,
) -> torch.Tensor:
    """`in_row_chunks` of a role's no-grad forward `fn` through `module`, its rows cut as `cutting`
    says (no token budget for a module sharded per layer: `scoring_budget`)."""
    tokens = scoring_budget(cutting.micro_batch_tokens, module)
    return in_row_chunks(fn, sequences, cutting.micro_batch_size, cutting.by_length, tokens)


def in_row_chunks(
    fn: Callable[[Sequences], torch.Tensor],
    sequences: Sequences,
    rows: int,
    by_length: bool = False,
    tokens: int | None = None,
) -> torch.Tensor:
    """`forward_in_chunks` over `Sequences`: a per-response-token function [b, t] in chunks of
    `rows` rows (or of a `tokens` budget), each trimmed of all-padding columns, padded back to [B, T]."""
    return forward_in_chunks(
        lambda ids, mask, prompt_length: fn(Sequences(ids, mask, prompt_length)),
        sequences.input_ids,
        sequences.attention_mask,
        sequences.prompt_length,
        sequences.response_width,
        rows,
        by_length,
        tokens,
    )
