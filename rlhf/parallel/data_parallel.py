"""A learner's data parallelism, applied to its plain module by functions (as torchtitan's
`apply_fsdp`): `apply_ddp` replicates it under DistributedDataParallel (rlhf/parallel/replicated.py),
`apply_fsdp` shards it per layer from rank 0's state (rlhf/parallel/fsdp.py). What they return is
what the learner's passes and optimizer step need (rlhf/train/learner.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlhf.parallel import fsdp
from rlhf.parallel.peers import Peers
from rlhf.parallel.replicated import fsdp_without_sync, replicate


@dataclass
class DataParallel:
    """A module trained over `peers`: `replicated` (ddp: its DistributedDataParallel wrapper, which
    the training passes go through) or `sharded` (fsdp2: the module itself, sharded per layer in
    place, its gradients arriving reduce-scattered; `offload`: the shards, gradients and AdamW state
    in CPU memory; `sync_once`: reduce-scattered in a step's last pass only)."""

    peers: Peers
    replicated: DistributedDataParallel | None = None
    sharded: nn.Module | None = None
    offload: bool = False
    sync_once: bool = False

    def local_pass(self) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        """The context of a pass that leaves its gradients unreduced (every pass of an optimizer step
        but the last): DDP's `no_sync`, or fsdp2's with `sync_once`; None: every pass reduces."""
        if self.replicated is not None:
            return self.replicated.no_sync
        if self.sharded is not None and self.sync_once:
            return partial(fsdp_without_sync, self.sharded)
        return None


def apply_ddp(module: nn.Module, peers: Peers, uses_every_parameter: bool = False) -> DataParallel:
    """`module` replicated over `peers` from rank 0's parameters (`replicate`: gradients summed in the
    backward of a step's last pass; `uses_every_parameter`: no unused-parameter walk)."""
    return DataParallel(peers, replicated=replicate(module, peers, uses_every_parameter))


def apply_fsdp(
    module: nn.Module,
    peers: Peers,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    bf16_compute: bool = False,
    offload: bool = False,
    sync_once: bool = False,
) -> DataParallel:
    """`module` sharded per decoder layer over `peers`, `optimizer`'s AdamW state with it, every rank's
    shards filled from rank 0's module and state (the others' may be on the meta device;
    `fsdp.shard_from_rank0`). `bf16_compute`: gathered in bf16 on a GPU; `offload` (dist.offload);
    `sync_once` (dist.grad_sync step): gradients reduce-scattered in a step's last pass only."""
    sharded = fsdp.shard_from_rank0(module, peers, optimizer, bf16_compute, offload)
    return DataParallel(peers, sharded=sharded, offload=offload, sync_once=sync_once)
