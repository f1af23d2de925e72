"""What every trained model is trained by, in the RL roles and the supervised stages alike: a
`Learner` holds the module, its `Optimizer` (rlhf/train/optimizer.py), the data parallelism applied
to the module (rlhf/parallel/data_parallel.py) and how its rows share passes (`MicroBatching`,
rlhf/train/micro_batches.py), and runs the micro-batch engine: `step` (one loss), or for a step of
several passes its parts, `micro_batches`, `passes`, `backward` and `optimizer_step`.

A learner gets its parallel plan when it is built: under ddp it is replicated at once; under fsdp2 its
owner calls `shard` once its whole state is in place (the supervised skeleton after a resume; the RL
runtime at a role's first use). No runtime sets a learner's parallel state after it is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlhf.config import OptimConfig
from rlhf.parallel import fsdp
from rlhf.parallel.data_parallel import DataParallel, apply_ddp, apply_fsdp
from rlhf.parallel.parallel_plan import ParallelPlan
from rlhf.parallel.peers import Peers
from rlhf.train.accumulation import Accumulation
from rlhf.train.micro_batches import (
    MicroBatch,
    MicroBatching,
    Rows,
    add_figures,
    forward_passes,
    micro_batches,
    summed_over_ranks,
)
from rlhf.train.optimizer import Optimizer

# a micro-batch's term of the step's loss (its mean times `micro.weight`, or its sums over the step's
# own counts) and the figures it adds to the step's `sums`
MicroBatchLoss = Callable[[MicroBatch], tuple[torch.Tensor, Mapping[str, Any]]]


@dataclass(frozen=True)
class Training:
    """How a role's module trains: AdamW over `total_steps` (`optim`), its micro-batches, the
    data-parallel plan it trains under (None: one process) and the device its batches go to (None:
    its parameters')."""

    optim: OptimConfig
    total_steps: int
    batching: MicroBatching = field(default_factory=MicroBatching)
    parallel: ParallelPlan | None = None
    device: torch.device | None = None


class Learner:
    """`module` trained by `optimizer`, its rows cut by `batching`. With `parallel` (data-parallel
    ranks) the gradients are summed over the ranks before clipping: "ddp" replicates the module now
    (`apply_ddp`; the training passes go through its wrapper), "fsdp2" shards it per layer at `shard`
    (`apply_fsdp`). `uses_every_parameter`: every pass reaches every trained parameter (ddp: no
    unused-parameter walk)."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        batching: MicroBatching | None = None,
        parallel: ParallelPlan | None = None,
        *,
        uses_every_parameter: bool = False,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.batching = batching or MicroBatching()
        self.plan = parallel
        self.peers: Peers | None = None if parallel is None else parallel.peers
        self.data_parallel: DataParallel | None = None
        self.accumulation: Accumulation | None = None  # the passes of the optimizer step under way
        self.shard_pending = parallel is not None and parallel.strategy == "fsdp2"
        if parallel is not None and parallel.strategy == "ddp":
            self.data_parallel = apply_ddp(module, parallel.peers, uses_every_parameter)

    @classmethod
    def build(cls, module: nn.Module, training: Training, uses_every_parameter: bool = False) -> Learner:
        """The learner of a role's `module` as `training` describes it."""
        optimizer = Optimizer(module.parameters(), training.optim, training.total_steps)
        return cls(
            module, optimizer, training.batching, training.parallel, uses_every_parameter=uses_every_parameter
        )

    def shard(self) -> None:
        """fsdp2: shard the module per layer now, as planned when the learner was built (its owner
        calls this once the whole state is in place: after a resume loaded it); once."""
        if self.shard_pending:
            plan = self.plan
            assert plan is not None  # shard_pending is set with a plan only
            self.shard_pending = False
            self.data_parallel = apply_fsdp(
                self.module, plan.peers, self.optimizer.adamw,
                bf16_compute=plan.bf16_compute, offload=plan.offload, sync_once=plan.sync_once,
            )  # fmt: skip

    @property
    def replicated(self) -> DistributedDataParallel | None:
        """ddp: the module's DistributedDataParallel wrapper."""
        return None if self.data_parallel is None else self.data_parallel.replicated

    @property
    def sharded(self) -> nn.Module | None:
        """fsdp2, once sharded: the sharded root (the module itself)."""
        return None if self.data_parallel is None else self.data_parallel.sharded

    @property
    def per_layer(self) -> bool:
        """Sharded per layer: gradients arrive reduce-scattered."""
        return self.sharded is not None

    @property
    def offload(self) -> bool:
        """Sharded with dist.offload: the shards, gradients and AdamW state in CPU memory."""
        return self.data_parallel is not None and self.data_parallel.offload

    @property
    def lockstep(self) -> bool:
        """Every rank runs as many training passes: DDP's and FSDP2's backwards are collectives."""
        return self.peers is not None and (self.per_layer or self.replicated is not None)

    # -- the passes of an optimizer step ---------------------------------------------------------
    @property
    def call(self) -> nn.Module:
        """The module a training pass goes through: under ddp its DistributedDataParallel wrapper
        (whose backward reduces the gradients, rlhf/parallel/replicated.py), else the module."""
        return self.replicated or self.module

    def train_forward(self, *args: Any, **kwargs: Any) -> Any:
        """`module(*args, **kwargs)` in a training pass (inside `passes`): under ddp through
        DistributedDataParallel, whose hooks then reduce the gradients in the backward."""
        return self.call(*args, **kwargs)

    def micro_batches(
        self, batch: Rows, count: Callable[[Any], float] | None = None, total: float = 1.0
    ) -> list[MicroBatch]:
        """This rank's micro-batches of `batch`, weighted `count(rows) / total`, with the fillers that
        keep the ranks in lockstep (rlhf/train/micro_batches.py `micro_batches`)."""
        return micro_batches(
            batch, self.batching.split, count, total, peers=self.peers, lockstep=self.lockstep
        )

    def passes(self, count: int) -> Accumulation:
        """The `count` forward/backward passes of the next optimizer step (each run inside
        `next_pass()`): under ddp (or fsdp2 with `sync_once`) the gradients are reduced over the ranks
        in the last pass's backward, the others accumulating locally; every rank must run `count`."""
        local = None if self.data_parallel is None else self.data_parallel.local_pass()
        self.accumulation = Accumulation(count, local)
        return self.accumulation

    @staticmethod
    def backward(loss: torch.Tensor, micro: MicroBatch) -> None:
        """The backward of a micro-batch's loss (a filler's times 0: its graph runs, it weighs nothing)."""
        (loss * 0.0 if micro.filler else loss).backward()  # type: ignore[no-untyped-call]  # unannotated in torch

    def drop_weightless_gradients(self, total: float) -> None:
        """A step without a valid token (`total` <= 0): in lockstep every rank ran its backwards at
        weight 0, where one process would have run none, and AdamW skips a parameter without a
        gradient (no moment or weight decay): dropping them gives the same step."""
        if self.lockstep and total <= 0:
            self.optimizer.adamw.zero_grad(set_to_none=True)

    def accumulate(
        self,
        batch: Rows,
        loss: MicroBatchLoss,
        count: Callable[[Any], float] | None = None,
        total: float = 1.0,
        *,
        sums: Sequence[str] = (),
    ) -> dict[str, float]:
        """The backwards of one optimizer step's passes on `batch` (the step itself: `optimizer_step`);
        the `sums` of `loss`'s figures over the real micro-batches and the ranks.

               rank share      this rank's rows of the step's batch (every rank holds the whole batch)
               micro-batches   the share cut by `batching` (rows of `micro_batch_size`, or
                               `micro_batch_tokens` longest first under rows x longest row, or packed)
               weights         each micro-batch's `count(rows) / total` (tokens for a token mean,
                               docs/algorithms.md §18; rows for a row mean; None: 1)
               fillers         under ddp and fsdp2 every rank runs the largest rank's number of passes, a
                               rank whose rows run out the batch's first row weighted 0 (figures dropped)
               passes          DDP's (and fsdp2's `dist.grad_sync step`) no-sync passes: gradients reduced
                               in the step's last backward only (`Accumulation`)"""
        micros = self.micro_batches(batch, count, total)
        passes = self.passes(len(micros))
        totals = dict.fromkeys(sums, 0.0)
        for micro in micros:
            with passes.next_pass():
                value, figures = loss(micro)
                self.backward(value, micro)
            if not micro.filler:
                add_figures(totals, figures)
        if count is not None:
            self.drop_weightless_gradients(total)
        return summed_over_ranks(totals, self.peers)

    def step(
        self,
        batch: Rows,
        loss: MicroBatchLoss,
        count: Callable[[Any], float] | None = None,
        total: float = 1.0,
        *,
        sums: Sequence[str] = (),
    ) -> tuple[dict[str, float], float]:
        """One optimizer step on `batch`: `accumulate`, then `optimizer_step` (global clipping, PPO
        paper §5.4; the NaN/inf guard, docs/algorithms.md §19; AdamW and the schedule); (the `sums`,
        the pre-clip gradient norm)."""
        totals = self.accumulate(batch, loss, count, total, sums=sums)
        return totals, self.optimizer_step()

    def forward_passes(
        self,
        batch: Rows,
        fn: Callable[[MicroBatch], dict[str, Any]],
        count: Callable[[Any], float] | None = None,
        total: float = 1.0,
        *,
        sums: Sequence[str] = (),
        share: bool = True,
    ) -> dict[str, float]:
        """`forward_passes` over this learner's micro-batches and ranks (`share` False: every rank
        runs every row); sharded per layer, in lockstep."""
        peers = self.peers if share else None
        return forward_passes(
            batch, fn, self.batching.split, count, total, peers=peers, lockstep=self.per_layer, sums=sums
        )

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    def trainable(self) -> list[torch.Tensor]:
        return self.optimizer.trainable()

    def whole_copy(self, model: nn.Module) -> contextlib.AbstractContextManager[nn.Module | None]:
        """`model` (the learner's module or a part of it) with its whole parameters for the body,
        what saving and exporting need: itself, or under fsdp2 a plain copy gathered by every rank
        (each must call this), rank 0's (None on the others; rlhf/parallel/fsdp.py `whole_copy`)."""
        return fsdp.whole_copy(model)

    def optimizer_step(self) -> float:
        """Clip the global gradient norm (when set), step, zero the gradients; the pre-clip norm.
        Under data parallelism the ranks' gradients are summed first: the norm is the global one.
        fsdp2: the backwards reduce-scattered them, the norm is over every rank's shards."""
        self.optimizer.check_not_released()
        accumulation, self.accumulation = self.accumulation, None
        if accumulation is not None:
            accumulation.finish()
        elif self.replicated is not None:
            raise RuntimeError("under ddp a step's backwards run inside `passes` (else nothing reduces them)")
        if self.sharded is not None:
            assert self.peers is not None  # sharded over the plan's peers
            o = self.optimizer
            return fsdp.step_shards(self.sharded, o.adamw, o.schedule, self.peers, o.max_grad_norm)
        if self.peers is not None and self.replicated is None:
            raise RuntimeError("data parallel without a strategy: the gradients would not be summed")
        # ddp: the gradients stay views of DDP's buckets, zeroed (rlhf/parallel/replicated.py)
        return self.optimizer.step(keep_gradients=self.replicated is not None)

    def release_optimizer_state(self) -> None:
        """Free AdamW's moments once the run is over and its checkpoint holds them."""
        self.optimizer.release_state()

    def state_dict(self) -> dict[str, Any]:
        # fsdp2: the sharded moments go to each rank's checkpoint shards (rlhf/rundir/sharded_checkpoint.py)
        return self.optimizer.state_dict(with_moments=self.sharded is None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
