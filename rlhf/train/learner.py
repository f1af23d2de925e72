"""What every trained model owns, in the RL roles and the supervised stages alike: its module, AdamW
and schedule, the data-parallel ranks and sharding it trains under, the forward/backward passes of
an optimizer step (`passes`: the ranks' gradients reduced in the last one), and the optimizer step
(global gradient clipping, step, zeroed gradients).

A learner gets its parallel strategy when it is built (`peers`, `strategy` and how it shards): under
ddp it is replicated at once; under fsdp2 its owner calls `shard` once its whole state is in place
(the supervised skeleton after a resume has loaded the checkpoint, rlhf/train/supervised.py; the RL
runtime of torchrun or of a Ray group at a role's first use, rlhf/runtime/distributed.py), which
shards it as planned. No runtime sets a learner's parallel state after it is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.runtime import fsdp
from rlhf.runtime.peers import Peers
from rlhf.runtime.replicated import Accumulation, fsdp_without_sync, replicate
from rlhf.train.lockstep import with_fillers
from rlhf.train.optim import build_optimizer, clip_and_step


class Learner:
    """`module` trained by AdamW over its trainable parameters with a warmup/decay schedule over
    `total_steps` and global gradient clipping (PPO paper §5.4, appendix C.2). With `peers`
    (data-parallel ranks, rlhf/runtime/peers.py) the gradients are summed over the ranks before
    clipping (`strategy` "ddp": by DistributedDataParallel in the backward of a step's last pass,
    rlhf/runtime/replicated.py); with "fsdp2" the module and its AdamW state are then sharded over them
    per layer (`shard`: every rank's shards from rank 0's module; `bf16_compute`, `offload`,
    `sync_once` as `shard_per_layer` takes them)."""

    peers: Peers | None = None  # data-parallel ranks: gradients and stats summed over them
    replicated = (
        None  # dist.strategy ddp: `module` under DistributedDataParallel (rlhf/runtime/replicated.py)
    )
    sharded = None  # dist.strategy fsdp2: the sharded root of `module` (rlhf/runtime/fsdp.py)
    per_layer = False  # sharded per layer: gradients arrive reduce-scattered
    offload = False  # per layer, dist.offload: the shards, gradients and AdamW state in CPU memory
    sync_once = False  # per layer, dist.grad_sync step: reduce-scattered in a step's last pass only
    released = False  # the AdamW moments freed at the end of a sharded run (release_optimizer_state)
    accumulation: Accumulation | None = None  # the passes of the optimizer step under way

    def __init__(
        self,
        module: nn.Module,
        optim: OptimConfig,
        total_steps: int,
        *,
        peers: Peers | None = None,
        strategy: str = "none",
        uses_every_parameter: bool = False,
        bf16_compute: bool = False,
        offload: bool = False,
        sync_once: bool = False,
    ) -> None:
        self.module = module
        self.uses_every_parameter = uses_every_parameter  # in every pass (ddp: no unused-parameter walk)
        self.max_grad_norm = optim.max_grad_norm
        self.optimizer, self.scheduler = build_optimizer(module.parameters(), optim, total_steps)
        # fsdp2: how `shard` shards it (`shard_per_layer`) once its whole state is in place
        self.sharding = {"bf16_compute": bf16_compute, "offload": offload, "sync_once": sync_once}
        self.shard_pending = False
        if peers is not None and strategy == "ddp":
            self.replicate(peers)
        elif peers is not None:
            self.peers = peers
            self.shard_pending = strategy == "fsdp2"

    def shard(self) -> None:
        """fsdp2: shard the module per layer now, as planned when the learner was built (its owner
        calls this once the whole state is in place: after a resume loaded it); once."""
        if self.shard_pending:
            self.shard_pending = False
            self.shard_per_layer(self.peers, **self.sharding)

    def replicate(self, peers: Peers) -> None:
        """dist.strategy ddp: the module under DistributedDataParallel over `peers`, every rank
        starting from rank 0's parameters; the training forwards go through it (`train_forward`; the
        supervised stages' `ModelCall` through `SupervisedRun.call`)."""
        self.peers = peers
        self.replicated = replicate(self.module, peers, self.uses_every_parameter)

    def shard_per_layer(
        self, peers: Peers, bf16_compute: bool = False, offload: bool = False, sync_once: bool = False
    ) -> None:
        """Shard the module per decoder layer over `peers` (rlhf/runtime/fsdp.py), AdamW's state with
        it, every rank's shards filled from rank 0's module and state (the others' may be on the
        meta device). `bf16_compute`: gathered in bf16 on a GPU; `offload` (dist.offload): the shards,
        gradients and AdamW state in CPU memory (rlhf/runtime/fsdp.py). `sync_once` (dist.grad_sync
        step): gradients reduce-scattered in the last pass of an optimizer step only, accumulated
        whole before (else after every pass)."""
        self.peers = peers
        self.sharded = fsdp.shard_from_rank0(self.module, peers, self.optimizer, bf16_compute, offload)
        self.per_layer = True
        self.offload = offload
        self.sync_once = sync_once

    # -- the passes of an optimizer step ---------------------------------------------------------
    def train_forward(self, *args, **kwargs):
        """`module(*args, **kwargs)` in a training pass (inside `passes`): under ddp through
        DistributedDataParallel, whose hooks then reduce the gradients in the backward."""
        return (self.replicated or self.module)(*args, **kwargs)

    def passes(self, count: int) -> Accumulation:
        """The `count` forward/backward passes of the next optimizer step (each run inside
        `next_pass()`): under ddp (or fsdp2 with `sync_once`) the gradients are reduced over the ranks
        in the last pass's backward, the others accumulating locally; every rank must run `count`."""
        local = None
        if self.replicated is not None:
            local = self.replicated.no_sync
        elif self.per_layer and self.sync_once:
            local = partial(fsdp_without_sync, self.sharded)
        self.accumulation = Accumulation(count, local)
        return self.accumulation

    def step_micro_batches(self, groups: list, rows: int, size: int) -> Iterator:
        """The supervised stages' micro-batches of one step (this rank's `groups` of its share of `rows`,
        `size` rows each), each yielded inside its pass (`passes`); sharded per layer or under ddp
        followed by None (a filler, rlhf/train/lockstep.py) up to the largest rank's count, so that
        every rank runs as many passes."""
        lockstep = self.per_layer or self.replicated is not None
        items = with_fillers(groups, rows, size, self.peers, lockstep)
        accumulation = self.passes(len(items))
        for item in items:
            with accumulation.next_pass():
                yield item

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def trainable(self) -> list[torch.Tensor]:
        return [q for group in self.optimizer.param_groups for q in group["params"]]

    @contextlib.contextmanager
    def whole_copies(self) -> Iterator[None]:
        """The whole module as plain tensors for the body: what saving and exporting need."""
        with fsdp.whole_copies([self.sharded] if self.sharded is not None else []):
            yield

    def optimizer_step(self) -> float:
        """Clip the global gradient norm (when set), step, zero the gradients; the pre-clip norm.
        Under data parallelism the ranks' gradients are summed first: the norm is the global one.
        fsdp2: the backwards reduce-scattered them, the norm is over every rank's shards."""
        if self.released:
            raise RuntimeError(
                "the optimizer state was released at the end of the run: resume from its checkpoint"
            )
        accumulation, self.accumulation = self.accumulation, None
        if accumulation is not None:
            accumulation.finish()
        elif self.replicated is not None:
            raise RuntimeError("under ddp a step's backwards run inside `passes` (else nothing reduces them)")
        if self.per_layer:
            return fsdp.step_shards(
                self.sharded, self.optimizer, self.scheduler, self.peers, self.max_grad_norm
            )
        if self.peers is not None and self.replicated is None:
            raise RuntimeError("data parallel without a strategy: the gradients would not be summed")
        # ddp: the gradients stay views of DDP's buckets, zeroed (rlhf/runtime/replicated.py)
        keep = self.replicated is not None
        return clip_and_step(self.optimizer, self.scheduler, self.trainable(), self.max_grad_norm, keep)

    def release_optimizer_state(self) -> None:
        """Free AdamW's moments once the run is over and its checkpoint holds them (a sharded run's
        export then gathers whole weights with that memory free); a later step would be refused."""
        self.optimizer.state.clear()
        self.released = True

    def state_dict(self) -> dict:
        # fsdp2: the sharded moments go to each rank's checkpoint shards (rlhf/rundir/sharded_checkpoint.py)
        optimizer = self.optimizer.state_dict() if self.sharded is None else None
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state["optimizer"] is not None:  # None: loaded from the checkpoint's shards
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["optimizer"] is None:  # the moments came from the shards; the current lr (which the
            # optimizer's own state would carry) is the schedule's last one, not the lr of step 0
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr
