"""What a learner needs from the other data-parallel ranks: the sums of their
step statistics and the rows they computed.

Each micro-batch's loss is weighted by its tokens over the whole minibatch's tokens
(rlhf/train/learner.py), so the sum of the ranks' gradients is the gradient of the one-process
token mean, and clipping the summed gradient clips by the global norm (PPO paper §5.4). Under `ddp`
DistributedDataParallel sums them (rlhf/parallel/replicated.py), FSDP2's reduce-scatters under
`fsdp2` (rlhf/parallel/fsdp.py); these peers give the rest: rows, statistics, the broadcast start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class Peers:
    """The ranks of `group` (None: the default group), as seen from this one."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        nccl = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    # -- statistics ------------------------------------------------------------------------------
    def sum(self, value: float) -> float:
        """The sum of a number over the ranks."""
        return self.sums([value])[0]

    def sums(self, values: Sequence[float]) -> list[float]:
        """The sums of several numbers over the ranks, in one all-reduce (float64)."""
        total = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.group)
        return total.tolist()

    def all(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank."""
        return self.sum(0.0 if flag else 1.0) == 0

    def largest(self, value: int) -> int:
        """The largest of an integer over the ranks (a rank's micro-batch count: how many every rank runs)."""
        top = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        return int(top.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (a small picklable object), in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    # -- rows ------------------------------------------------------------------------------------
    def rows(self, batch_size: int) -> slice:
        """This rank's contiguous share of `batch_size` rows (shares differ by at most one row)."""
        return share_of(batch_size, self.rank, self.world_size)

    def padded_share(self, batch_size: int) -> tuple[list[int], int]:
        """(row indices, how many are real): this rank's share (`rows`) followed by fillers up to the
        largest share, so that every rank runs the same forwards (lockstep); a filler repeats the
        share's last row (row 0 for an empty share), and its results are dropped or weighted 0."""
        share = self.rows(batch_size)
        index = list(range(share.start, share.stop))
        width = -(-batch_size // self.world_size)
        return index + [index[-1] if index else 0] * (width - len(index)), len(index)

    def gather_rows(self, local: torch.Tensor, batch_size: int) -> torch.Tensor:
        """The whole batch's rows from every rank's share (`rows`), joined along dim 0."""
        width = -(-batch_size // self.world_size)  # the largest share
        padded = torch.zeros((width, *local.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        shares = [share_of(batch_size, r, self.world_size) for r in range(self.world_size)]
        return torch.cat([part[: s.stop - s.start] for part, s in zip(parts, shares)])


def share_of(batch_size: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s contiguous rows of `batch_size`: the first `batch_size % world_size` ranks take
    one row more than the others."""
    base, extra = divmod(batch_size, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def current_peers() -> Peers | None:
    """The data-parallel ranks of this torchrun launch (`process_group.data_parallel`), else None."""
    if dist.is_available() and dist.is_initialized():
        return Peers()
    return None
