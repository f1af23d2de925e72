"""How a step's rows share forward/backward passes: this rank's share of the rows, cut into
micro-batches (by rows, by length, by a token budget or packed), each weighted by its share of the
step's denominator, with fillers that keep the ranks in lockstep (docs/algorithms.md §18)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlhf.data.length_grouping import micro_batch_groups, packed_groups, token_budget_groups
from rlhf.parallel.peers import Peers


@dataclass(frozen=True)
class MicroBatching:
    """How a learner cuts rows into passes (`split_rows`): `micro_batch_size` rows each (longest first
    with `by_length`), or under a `micro_batch_tokens` budget (None/0: off), or cut for packed
    forwards (`packing`)."""

    micro_batch_size: int = 1
    by_length: bool = False
    micro_batch_tokens: int | None = None
    packing: bool = False

    def split(self, lengths: list[int]) -> list[list[int]]:
        """The micro-batches of rows of `lengths` (`split_rows`: the one place that decides how rows
        share a pass)."""
        return split_rows(
            lengths, self.micro_batch_size, self.by_length, self.micro_batch_tokens, self.packing
        )


class Rows(Protocol):
    """A step's batch as the engine sees it: an Experience (rlhf/rl/experience.py) or a `RowList`."""

    @property
    def batch_size(self) -> int: ...

    def lengths(self) -> list[int]:
        """Each row's computed positions: what `Learner.split` measures."""
        ...

    def take(self, index: list[int]) -> Rows:
        """The rows at `index`, in that order."""
        ...

    def filler(self) -> Rows:
        """One row that runs every forward and backward a real micro-batch runs (weighted 0)."""
        ...


class RowList(list[Any]):
    """A supervised stage's rows (a plain list) as `Rows`: `measure(row)` is a row's positions."""

    def __init__(self, rows: Iterable[Any], measure: Callable[[Any], int]) -> None:
        super().__init__(rows)
        self.measure = measure

    @property
    def batch_size(self) -> int:
        return len(self)

    def lengths(self) -> list[int]:
        return [self.measure(row) for row in self]

    def take(self, index: list[int]) -> RowList:
        return RowList([self[i] for i in index], self.measure)

    def filler(self) -> RowList:
        return self.take([0])


@dataclass
class MicroBatch:
    """One pass's rows: `weight` is their share of the step's denominator (0 for a filler);
    `index` their positions in this rank's share of the batch (None: a filler, whose loss is
    weighted 0 and whose figures are dropped)."""

    rows: Any
    weight: float
    index: list[int] | None

    @property
    def filler(self) -> bool:
        return self.index is None


def split_rows(
    lengths: list[int], size: int, by_length: bool, tokens: int | None = None, packing: bool = False
) -> list[list[int]]:
    """Rows of `lengths` cut into micro-batches of `size` rows (positions), longest first with
    `by_length` (rlhf/data/length_grouping.py): how rows share a forward/backward pass. With a
    token budget `tokens` (`train.micro_batch_tokens`; None or 0: off) the rows are sorted longest
    first and cut so that each micro-batch's rows x longest row fits it (`token_budget_groups`; a
    longer row alone), whatever `size` and `by_length`. The weights are each micro-batch's share of
    the step's count, so the step's gradient is the same (docs/algorithms.md §18). With `packing`
    (`train.packing`; the forwards themselves pack, rlhf/models/packing.py) the rows are cut by
    `packed_groups` under `tokens`, or else under what a padded micro-batch would compute at most
    (`size` x the longest row). Every rank's count of passes, which a budget makes differ, is
    evened by `micro_batches`."""
    if packing and lengths:
        return packed_groups(lengths, tokens or size * max(max(lengths), 1))
    if tokens:
        return token_budget_groups(lengths, tokens)
    return micro_batch_groups(lengths, size, by_length)


def micro_batches(
    batch: Rows,
    split: Callable[[list[int]], list[list[int]]],
    count: Callable[[Any], float] | None = None,
    total: float = 1.0,
    *,
    peers: Peers | None = None,
    lockstep: bool = False,
) -> list[MicroBatch]:
    """The micro-batches of `batch` (with `peers`: of this rank's share of its rows) as `split` cuts
    them, each weighted `count(rows) / total` (None: 1; a `total` under 1, a step without a valid
    token, counts as 1). A micro-batch of weight 0 is left out, or in `lockstep` (with `peers`) run,
    followed by fillers (the batch's first row, weight 0) up to the largest rank's count."""
    mine = batch
    if peers is not None:
        share = peers.rows(batch.batch_size)
        mine = batch.take(list(range(share.start, share.stop)))
    out: list[MicroBatch] = []
    for group in split(mine.lengths()):
        rows = mine.take(group)
        weight = 1.0 if count is None else count(rows) / max(float(total), 1.0)
        if weight > 0 or lockstep:
            out.append(MicroBatch(rows, weight, group))
    if lockstep and peers is not None:
        filler = batch.filler()
        out += [MicroBatch(filler, 0.0, None) for _ in range(peers.largest(len(out)) - len(out))]
    return out


@torch.no_grad()
def forward_passes(
    batch: Rows,
    fn: Callable[[MicroBatch], dict[str, Any]],
    split: Callable[[list[int]], list[list[int]]],
    count: Callable[[Any], float] | None = None,
    total: float = 1.0,
    *,
    peers: Peers | None = None,
    lockstep: bool = False,
    sums: Sequence[str] = (),
) -> dict[str, float]:
    """`fn` on each micro-batch of `batch` (`micro_batches`) without gradients (an evaluation, a
    reference's scores): the `sums` of its figures over the real micro-batches (and the ranks, with
    `peers`); fillers' figures dropped."""
    totals = dict.fromkeys(sums, 0.0)
    for micro in micro_batches(batch, split, count, total, peers=peers, lockstep=lockstep):
        figures = fn(micro)
        if not micro.filler:
            add_figures(totals, figures)
    return summed_over_ranks(totals, peers)


def summed_over_ranks(totals: dict[str, float], peers: Peers | None) -> dict[str, float]:
    """`totals` summed over the ranks (one all-reduce; every rank holds the same keys)."""
    if peers is None or not totals:
        return totals
    return dict(zip(totals, peers.sums(list(totals.values()))))


def add_figures(totals: dict[str, float], figures: Mapping[str, Any]) -> None:
    for key, value in figures.items():
        if key in totals:
            totals[key] += float(value)
