"""What a learner needs from the other data-parallel ranks: the sum of their gradients and of their
step statistics, and the rows they computed.

Each micro-batch's loss is weighted by its tokens over the whole minibatch's tokens
(rlhf/rl/roles/learner.py), so the sum of the ranks' gradients is the gradient of the one-process
token mean, and clipping the summed gradient clips by the global norm (PPO paper §5.4). Under `ddp`
DistributedDataParallel sums them (rlhf/runtime/replicated.py); `sum_gradients` (flat buckets, once
per optimizer step) serves the supervised stages' whole-model fsdp2 step (rlhf/runtime/fsdp.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

BUCKET_ELEMENTS = 1 << 24  # gradient elements per all-reduce (64 MB in float32)


class Peers:
    """The ranks of `group` (None: the default group), as seen from this one."""

    def __init__(self, group=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        nccl = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    # -- gradients -------------------------------------------------------------------------------
    def sum_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Replace each parameter's gradient by the sum over the ranks. A parameter without a gradient
        on some ranks (no valid token there) counts as zeros; one without a gradient on every rank
        keeps none (the optimizer skips it, as in one process)."""
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.device)
        dist.all_reduce(present, group=self.group)
        used = [p for p, n in zip(params, present.tolist()) if n > 0]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in buckets(used):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
                offset += p.numel()

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Every rank starts from rank 0's parameters (as DDP does when it wraps a module)."""
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0, group=self.group)

    # -- statistics ------------------------------------------------------------------------------
    def sum(self, value: float) -> float:
        """The sum of a number over the ranks."""
        return self.sums([value])[0]

    def sums(self, values: Sequence[float]) -> list[float]:
        """The sums of several numbers over the ranks, in one all-reduce (float64)."""
        total = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.group)
        return total.tolist()

    def gather(self, value) -> list:
        """Every rank's `value` (a small picklable object), in rank order."""
        out: list = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    # -- rows ------------------------------------------------------------------------------------
    def rows(self, batch_size: int) -> slice:
        """This rank's contiguous share of `batch_size` rows (shares differ by at most one row)."""
        return share_of(batch_size, self.rank, self.world_size)

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


def buckets(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`params` in consecutive groups of one gradient dtype and device, each of at most
    BUCKET_ELEMENTS elements (or one larger parameter)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        last = out[-1] if out else None
        fits = last is not None and size + p.numel() <= BUCKET_ELEMENTS
        if fits and last[0].grad.dtype == p.grad.dtype and last[0].grad.device == p.grad.device:
            last.append(p)
            size += p.numel()
        else:
            out.append([p])
            size = p.numel()
    return out


def current_peers() -> Peers | None:
    """The data-parallel ranks of this torchrun launch (`process_group.data_parallel`), else None."""
    if dist.is_available() and dist.is_initialized():
        return Peers()
    return None
