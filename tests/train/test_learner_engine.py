"""The learner's micro-batch engine (rlhf/train/learner.py): a rank's share, the split, the weights,
the lockstep fillers and the sums, checked against plain loops; `Learner.step` gives the gradient of
the step's token mean (a closed form over every row) whatever the micro-batch size, with fully
masked rows and a batch of one."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.parallel.peers import share_of
from rlhf.train.learner import Learner, Training
from rlhf.train.micro_batches import MicroBatching, RowList, micro_batches, split_rows


class FakePeers:
    """`world_size` ranks seen from `rank`, the collectives given by the other ranks' values."""

    def __init__(self, rank: int, world_size: int, counts: list[int] | None = None) -> None:
        self.rank, self.world_size, self.counts = rank, world_size, counts

    def rows(self, batch_size: int) -> slice:
        return share_of(batch_size, self.rank, self.world_size)

    def largest(self, value: int) -> int:
        return max([value, *(self.counts or [])])

    def sums(self, values):
        return [v * self.world_size for v in values]  # every rank holding the same figures


def rows_of(lengths: list[int]) -> RowList:
    return RowList([{"id": i, "length": n} for i, n in enumerate(lengths)], lambda row: row["length"])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_every_rank_runs_the_largest_ranks_count_and_the_shares_cover_every_row_once(world_size, size):
    batch = rows_of([5, 1, 4, 2, 3, 7, 6])  # 7 rows: shares of 2 and 1 rows at 4 ranks
    split = lambda lengths: split_rows(lengths, size, False)  # noqa: E731
    counts = [len(split([0] * len(range(7)[share_of(7, r, world_size)]))) for r in range(world_size)]
    seen = []
    for rank in range(world_size):
        peers = FakePeers(rank, world_size, counts)
        micros = micro_batches(batch, split, peers=peers, lockstep=True)
        assert len(micros) == max(counts) == math.ceil(math.ceil(7 / world_size) / size)
        real = [m for m in micros if not m.filler]
        seen += [row["id"] for m in real for row in m.rows]
        for m in micros:
            if m.filler:  # the whole batch's first row, weighted 0
                assert [row["id"] for row in m.rows] == [0] and m.weight == 0.0
    assert sorted(seen) == list(range(7))


def test_weights_are_each_micro_batchs_share_and_weightless_ones_run_only_in_lockstep():
    batch = rows_of([3, 0, 2, 0, 4])  # "length" doubles as the row's valid tokens; two rows have none
    split = lambda lengths: split_rows(lengths, 1, False)  # noqa: E731
    tokens = lambda rows: float(sum(row["length"] for row in rows))  # noqa: E731
    micros = micro_batches(batch, split, tokens, total=9.0)
    assert [m.weight for m in micros] == [3 / 9, 2 / 9, 4 / 9] and [m.index for m in micros] == [
        [0],
        [2],
        [4],
    ]
    locked = micro_batches(batch, split, tokens, total=9.0, peers=FakePeers(0, 1), lockstep=True)
    assert [m.weight for m in locked] == [3 / 9, 0.0, 2 / 9, 0.0, 4 / 9] and not any(m.filler for m in locked)
    # a step without a valid token: the total counts as 1, every weight 0
    assert [m.weight for m in micro_batches(rows_of([0, 0]), split, tokens, total=0.0, lockstep=True)] == [
        0.0,
        0.0,
    ]


class Rows:
    """Token rows for a linear model: x [B, T, D], a 0/1 mask [B, T] (fully masked rows allowed)."""

    def __init__(self, x: torch.Tensor, mask: torch.Tensor) -> None:
        self.x, self.mask = x, mask

    @property
    def batch_size(self) -> int:
        return len(self.x)

    def lengths(self) -> list[int]:
        return self.mask.sum(1).long().tolist()

    def take(self, index: list[int]) -> Rows:
        return Rows(self.x[index], self.mask[index])

    def filler(self) -> Rows:
        return Rows(self.x[:1], torch.zeros_like(self.mask[:1]))


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("size,by_length", [(1, False), (2, False), (2, True), (8, False)])
def test_a_step_is_the_token_mean_of_every_row_however_it_is_split(rows, size, by_length):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 4, 3, generator=generator)
    mask = (torch.rand(rows, 4, generator=generator) > 0.4).float()
    if rows > 1:
        mask[1] = 0.0  # a fully masked row
    mask[0, 0] = 1.0  # at least one valid token
    model = nn.Linear(3, 1)
    # the closed form: the loss summed over every valid token / their count
    ((model(x).squeeze(-1) ** 2) * mask).sum().div(mask.sum()).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    learner = Learner.build(model, Training(OptimConfig(), 1, MicroBatching(size, by_length)))
    learner.optimizer_step = lambda: 0.0  # the gradients stay for the test to read
    seen = []

    def loss(micro):
        m = micro.rows.mask
        mean = ((model(micro.rows.x).squeeze(-1) ** 2) * m).sum() / m.sum().clamp(min=1)  # its token mean
        seen.append(micro.index)
        return micro.weight * mean, {"tokens": m.sum()}

    sums, _ = learner.step(
        Rows(x, mask), loss, lambda r: float(r.mask.sum()), float(mask.sum()), sums=("tokens",)
    )
    for got, want in zip((p.grad for p in model.parameters()), expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert sums == {"tokens": float(mask.sum())}
    # a micro-batch without a valid token is left out (one process: no lockstep)
    groups = split_rows(mask.sum(1).long().tolist(), size, by_length)
    assert sorted(i for index in seen for i in index) == sorted(
        i for g in groups if mask[g].sum() > 0 for i in g
    )
