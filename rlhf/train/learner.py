"""What every trained model owns, in the RL roles and the supervised stages alike: its module, AdamW
and schedule, the data-parallel ranks and sharding it trains under, and the one micro-batch engine
every trainer calls with its own loss (`step`; `forward_passes` for the passes without a backward).

A learner gets its parallel strategy when it is built (`peers`, `strategy` and how it shards): under
ddp it is replicated at once; under fsdp2 its owner calls `shard` once its whole state is in place
(the supervised skeleton after a resume; the RL runtime at a role's first use). No runtime sets a
learner's parallel state after it is built.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlhf.config import OptimConfig
from rlhf.core import explained_variance
from rlhf.data.length_grouping import micro_batch_groups, packed_groups, token_budget_groups
from rlhf.parallel import fsdp
from rlhf.parallel.peers import Peers
from rlhf.parallel.replicated import fsdp_without_sync, replicate


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


class StepStats:
    """The stats of one optimizer step: token-weighted means of per-micro-batch stats; keys ending
    in `_max`/`_min` combine by max/min; explained variance over the whole minibatch's tokens
    (a ratio of variances, not a token mean: averaging it over micro-batches would be wrong).

    The sums and extremes stay float64 tensors on the stats' device until `result` reads them all
    in one transfer: on a GPU each read is a host-device sync that stalls the launches of the next
    micro-batch (12 a policy step before). float64 keeps the figures those of Python floats."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}  # float64 scalars, on the stats' device
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, torch.Tensor] = {}
        self.values: list[torch.Tensor] = []  # critic values and returns on valid tokens, for the
        self.returns: list[torch.Tensor] = []  # minibatch's explained variance

    def add(self, stats: Mapping[str, Any], weight: float, prefix: str) -> None:
        if weight <= 0:  # a micro-batch without a valid token (a sharded rank's filler) adds nothing
            return
        for key, value in stats.items():
            name = f"{prefix}/{key}"
            value = torch.as_tensor(value).detach().double().reshape(())  # a scalar, as float() took
            if key.endswith(("_max", "_min")):
                old = self.extremes.get(name)
                pick = torch.maximum if key.endswith("_max") else torch.minimum
                self.extremes[name] = value if old is None else pick(old, value)
                continue
            self.sums[name] = self.sums.get(name, 0.0) + value * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def _read(self) -> tuple[dict[str, float], dict[str, float]]:
        """The sums and extremes as Python floats, read from the device in one transfer."""
        names = [*self.sums, *self.extremes]
        held = [*self.sums.values(), *self.extremes.values()]
        read = torch.stack([v.to(held[0].device) for v in held]).tolist() if held else []
        floats = dict(zip(names, read))
        return {k: floats[k] for k in self.sums}, {k: floats[k] for k in self.extremes}

    def add_values(self, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> None:
        valid = mask.bool()
        self.values.append(values.detach()[valid].float())
        self.returns.append(returns[valid].float())

    def result(self, peers: Peers | None = None) -> dict[str, float]:
        """The step's stats; with `peers` (data-parallel ranks, rlhf/parallel/peers.py) over the
        micro-batches of every rank."""
        sums, extremes = self._read()
        if peers is not None:
            return merged_step_stats(peers.gather((sums, self.weights, extremes, self.moments())))
        out = {k: sums[k] / max(self.weights[k], 1e-12) for k in sums}
        out.update(extremes)
        if self.values:
            v, g = torch.cat(self.values), torch.cat(self.returns)
            out["value/explained_variance"] = float(explained_variance(v, g, torch.ones_like(v)))
        return out

    def moments(self) -> list[float]:
        """[n, sum G, sum G^2, sum R, sum R^2] (float64) of returns G and residuals R = G - V: what the
        explained variance of several ranks' tokens needs."""
        if not self.values:
            return [0.0] * 5
        g = torch.cat(self.returns).double()
        r = g - torch.cat(self.values).double()
        return [
            float(len(g)),
            float(g.sum()),
            float(g.square().sum()),
            float(r.sum()),
            float(r.square().sum()),
        ]


def merged_step_stats(
    parts: list[tuple[dict[str, float], dict[str, float], dict[str, float], list[float]]],
) -> dict[str, float]:
    """StepStats.result over the (sums, weights, extremes, moments) of every rank's micro-batches."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    extremes: dict[str, float] = {}
    for part_sums, part_weights, part_extremes, _ in parts:
        for k, v in part_sums.items():
            sums[k] = sums.get(k, 0.0) + v
            weights[k] = weights.get(k, 0.0) + part_weights[k]
        for k, v in part_extremes.items():
            extremes[k] = (max if k.endswith("_max") else min)(extremes.get(k, v), v)
    out = {k: sums[k] / max(weights[k], 1e-12) for k in sums}
    out.update(extremes)
    n, g, g2, r, r2 = (sum(m[i] for *_, m in parts) for i in range(5))
    if n > 0:
        var_g = (g2 - g * g / n) / (n - 1) if n > 1 else 0.0
        var_r = (r2 - r * r / n) / (n - 1) if n > 1 else 0.0
        out["value/explained_variance"] = 1 - var_r / var_g if var_g > 0 else 0.0
    return out


# a micro-batch's term of the step's loss and the figures it adds to the step's sums
LossFn = Callable[[MicroBatch], tuple[torch.Tensor, dict[str, Any]]]


class Learner:
    """`module` trained by AdamW over its trainable parameters with a warmup/decay schedule over
    `total_steps` and global gradient clipping (PPO paper §5.4, appendix C.2). With `peers`
    (data-parallel ranks, rlhf/parallel/peers.py) the gradients are summed over the ranks before
    clipping (`strategy` "ddp": by DistributedDataParallel in the backward of a step's last pass,
    rlhf/parallel/replicated.py); with "fsdp2" the module and its AdamW state are then sharded over them
    per layer (`shard`: every rank's shards from rank 0's module; `bf16_compute`, `offload`,
    `sync_once` as `shard_per_layer` takes them)."""

    peers: Peers | None = None  # data-parallel ranks: gradients and stats summed over them
    # dist.strategy ddp: `module` under DistributedDataParallel (rlhf/parallel/replicated.py)
    replicated: DistributedDataParallel | None = None
    sharded: nn.Module | None = (
        None  # dist.strategy fsdp2: the sharded root of `module` (rlhf/parallel/fsdp.py)
    )
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
        micro_batch_size: int = 1,
        by_length: bool = False,
        micro_batch_tokens: int | None = None,
        packing: bool = False,
    ) -> None:
        self.module = module
        self.packing = packing  # micro-batches cut for packed forwards (`packed_groups`)
        self.micro_batch_size = micro_batch_size  # rows per forward/backward pass
        self.micro_batch_tokens = micro_batch_tokens  # else rows x longest row per pass (None/0: off)
        self.by_length = by_length  # micro-batches of rows of similar length (rlhf/data/length_grouping.py)
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
            assert self.peers is not None  # shard_pending is set with peers only
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
        """Shard the module per decoder layer over `peers` (rlhf/parallel/fsdp.py), AdamW's state with
        it, every rank's shards filled from rank 0's module and state (the others' may be on the
        meta device). `bf16_compute`: gathered in bf16 on a GPU; `offload` (dist.offload): the shards,
        gradients and AdamW state in CPU memory (rlhf/parallel/fsdp.py). `sync_once` (dist.grad_sync
        step): gradients reduce-scattered in the last pass of an optimizer step only, accumulated
        whole before (else after every pass)."""
        self.peers = peers
        self.sharded = fsdp.shard_from_rank0(self.module, peers, self.optimizer, bf16_compute, offload)
        self.per_layer = True
        self.offload = offload
        self.sync_once = sync_once

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

    def passes(self, count: int) -> Accumulation:
        """The `count` forward/backward passes of the next optimizer step (each run inside
        `next_pass()`): under ddp (or fsdp2 with `sync_once`) the gradients are reduced over the ranks
        in the last pass's backward, the others accumulating locally; every rank must run `count`."""
        local: Callable[[], contextlib.AbstractContextManager[None]] | None = None
        if self.replicated is not None:
            local = self.replicated.no_sync
        elif self.per_layer and self.sync_once:
            assert self.sharded is not None  # set with per_layer
            local = partial(fsdp_without_sync, self.sharded)
        self.accumulation = Accumulation(count, local)
        return self.accumulation

    # -- the micro-batch engine -------------------------------------------------------------------
    def split(self, lengths: list[int]) -> list[list[int]]:
        """This learner's micro-batches of rows of `lengths` (`split_rows`: the one place that decides
        how rows share a pass)."""
        return split_rows(
            lengths, self.micro_batch_size, self.by_length, self.micro_batch_tokens, self.packing
        )

    @property
    def lockstep(self) -> bool:
        """Every rank runs as many training passes: DDP's and FSDP2's backwards are collectives."""
        return self.peers is not None and (self.per_layer or self.replicated is not None)

    def step(
        self,
        batch: Rows,
        losses: Sequence[LossFn],
        count: Callable[[Any], float] | None = None,
        total: float = 1.0,
        *,
        sums: Sequence[str] = (),
        then: Sequence[Callable[[], tuple[torch.Tensor | None, dict[str, Any]]]] = (),
        before_update: Callable[[], None] | None = None,
    ) -> tuple[dict[str, float], float]:
        """One optimizer step on `batch`; (the `sums`, the pre-clip gradient norm).

               rank share      this rank's rows of the step's batch (every rank holds the whole batch)
               micro-batches   the share cut by `split` (rows of `micro_batch_size`, or `micro_batch_tokens`
                               longest first under rows x longest row, or packed)
               weights         each micro-batch's `count(rows) / total` (tokens for a token mean,
                               docs/algorithms.md §18; rows for a row mean)
               fillers         under ddp and fsdp2 every rank runs the largest rank's number of passes, a
                               rank whose rows run out the batch's first row weighted 0 (figures dropped)
               passes          DDP's (and fsdp2's `dist.grad_sync step`) no-sync passes: gradients reduced
                               in the step's last backward only (`Accumulation`)
               optimizer step  global clipping (PPO paper §5.4), the NaN/inf guard (docs/algorithms.md
                               §19), AdamW and the schedule (`optimizer_step`, `build_optimizer`)
        Each micro-batch runs each of `losses` in a forward/backward pass of its own
               (a loss's graph is freed before the next one's forward); a loss function returns its
               micro-batch's term of the step's loss (its mean times `micro.weight`, or its sums over the
               step's own counts) and the figures it adds to `sums` (summed over the real micro-batches
               and the ranks). `count`/`total`: the weights (`micro_batches`). `then`: passes after the
               micro-batches' (PPO-ptx: a loss on other rows, or None). `before_update`: called before the
               optimizer step (a shared critic's pre-training keeps its head's gradients only)."""
        lockstep = self.lockstep
        micros = micro_batches(batch, self.split, count, total, peers=self.peers, lockstep=lockstep)
        passes = self.passes(len(losses) * len(micros) + len(then))
        totals = dict.fromkeys(sums, 0.0)
        for micro in micros:
            for loss_fn in losses:
                with passes.next_pass():
                    loss, figures = loss_fn(micro)
                    # torch's Tensor.backward is unannotated
                    (loss * 0.0 if micro.filler else loss).backward()  # type: ignore[no-untyped-call]
                if not micro.filler:
                    _add(totals, figures)
        if lockstep and count is not None and total <= 0:
            # every rank ran its backwards at weight 0; one process would have run none, and AdamW
            # skips a parameter without a gradient (no moment or weight decay): the same step
            self.optimizer.zero_grad(set_to_none=True)
        for extra in then:
            with passes.next_pass():
                extra_loss, extra_figures = extra()
                if extra_loss is not None:
                    extra_loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is unannotated
            _add(totals, extra_figures)
        if before_update is not None:
            before_update()
        return _summed(totals, self.peers), self.optimizer_step()

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
            batch, fn, self.split, count, total, peers=peers, lockstep=self.per_layer, sums=sums
        )

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def trainable(self) -> list[torch.Tensor]:
        return [q for group in self.optimizer.param_groups for q in group["params"]]

    def whole_copy(self, model: nn.Module) -> contextlib.AbstractContextManager[nn.Module | None]:
        """`model` (the learner's module or a part of it) with its whole parameters for the body,
        what saving and exporting need: itself, or under fsdp2 a plain copy gathered by every rank
        (each must call this), rank 0's (None on the others; rlhf/parallel/fsdp.py `whole_copy`)."""
        return fsdp.whole_copy(model)

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
            assert self.sharded is not None and self.peers is not None  # set with per_layer
            return fsdp.step_shards(
                self.sharded, self.optimizer, self.scheduler, self.peers, self.max_grad_norm
            )
        if self.peers is not None and self.replicated is None:
            raise RuntimeError("data parallel without a strategy: the gradients would not be summed")
        # ddp: the gradients stay views of DDP's buckets, zeroed (rlhf/parallel/replicated.py)
        keep = self.replicated is not None
        return clip_and_step(self.optimizer, self.scheduler, self.trainable(), self.max_grad_norm, keep)

    def release_optimizer_state(self) -> None:
        """Free AdamW's moments once the run is over and its checkpoint holds them (a sharded run's
        export then gathers whole weights with that memory free); a later step would be refused."""
        self.optimizer.state.clear()
        self.released = True

    def state_dict(self) -> dict[str, Any]:
        # fsdp2: the sharded moments go to each rank's checkpoint shards (rlhf/rundir/sharded_checkpoint.py)
        optimizer = self.optimizer.state_dict() if self.sharded is None else None
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["optimizer"] is not None:  # None: loaded from the checkpoint's shards
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["optimizer"] is None:  # the moments came from the shards; the current lr (which the
            # optimizer's own state would carry) is the schedule's last one, not the lr of step 0
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr


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
            _add(totals, figures)
    return _summed(totals, peers)


def _summed(totals: dict[str, float], peers: Peers | None) -> dict[str, float]:
    """`totals` summed over the ranks (one all-reduce; every rank holds the same keys)."""
    if peers is None or not totals:
        return totals
    return dict(zip(totals, peers.sums(list(totals.values()))))


def _add(totals: dict[str, float], figures: Mapping[str, Any]) -> None:
    for key, value in figures.items():
        if key in totals:
            totals[key] += float(value)


class Accumulation:
    """The `passes` forward/backward passes of one optimizer step, each entered with `next_pass()`:
    the gradients are reduced over the ranks in the last pass's backward only, the other passes
    running inside `local()` (DDP's `no_sync`; fsdp2 with `dist.grad_sync step`: FSDP2's
    `set_requires_gradient_sync(False)`, rlhf/parallel/replicated.py); `local` None: every pass
    reduces (one process, fsdp2's per-micro-batch reduction). `finish` checks that the reducing
    pass ran."""

    def __init__(
        self, passes: int, local: Callable[[], contextlib.AbstractContextManager[None]] | None
    ) -> None:
        self.passes = passes
        self.local = local
        self.done = 0

    @contextlib.contextmanager
    def next_pass(self) -> Iterator[None]:
        self.done += 1
        if self.done > self.passes:
            raise RuntimeError(f"an optimizer step of {self.passes} passes ran pass {self.done}")
        with self.local() if self.local is not None and self.done < self.passes else contextlib.nullcontext():
            yield

    def finish(self) -> None:
        if self.done != self.passes:
            raise RuntimeError(
                f"an optimizer step ran {self.done} of its {self.passes} forward/backward passes: the last, "
                "which reduces the gradients over the ranks, did not run"
            )


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: Iterable[torch.Tensor],
    max_grad_norm: float | None,
    keep_gradients: bool = False,
) -> float:
    """Clip the global gradient norm (docs/algorithms.md#19-global-gradient-clipping) when set, step, and
    return the pre-clip norm. The gradients are dropped after (AdamW skips a parameter that gets none
    in the next step), or with `keep_gradients` zeroed in place (DDP's bucket views, reused).
    A NaN or infinite norm skips the step (weights, AdamW's moments and the schedule unchanged): one
    such step would spread the NaN into every weight (algorithms.md §19)."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]  # every one of them
    norm = torch.nn.utils.get_total_norm(grads) if params else torch.zeros(())
    if is_finite_norm(float(norm)):
        # clip_grad_norm_'s coefficient, min(1, max / (norm + 1e-6)); the gradients are rescaled only
        # when it is below 1 (torch multiplies by it always, 1 included: a pass over every gradient)
        if max_grad_norm is not None and not bool(max_grad_norm / (norm + 1e-6) >= 1.0):
            torch.nn.utils.clip_grads_with_norm_(params, max_grad_norm, norm)
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=not keep_gradients)
    return float(norm)


def is_finite_norm(norm: float) -> bool:
    """Whether an optimizer step with this gradient norm was taken (a NaN/inf norm skips it)."""
    return math.isfinite(norm)


def step_metrics(prefix: str, grad_norm: float) -> dict[str, float]:
    """An optimizer step's own metrics: its pre-clip gradient norm, and whether it was skipped for a
    NaN/inf norm (averaged by `mean_over_steps`, rlhf/rl/trainer.py, into the share of the
    update's steps skipped). A skipped step's norm is left out of the mean of the others."""
    skipped = not is_finite_norm(grad_norm)
    return {
        f"{prefix}/skipped_step_fraction": float(skipped),
        **({} if skipped else {f"{prefix}/grad_norm": grad_norm}),
    }


def build_optimizer(
    params: Iterable[torch.Tensor], config: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over trainable `params` and a LambdaLR schedule (warmup, then the configured decay)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters: is every weight frozen?")
    optimizer = torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=(config.betas[0], config.betas[1]),
        weight_decay=config.weight_decay,
        eps=1e-8,
        # one kernel over all tensors (CPU and CUDA); a model built on the meta device (a sharded
        # run's ranks but 0) has no kernel until it is sharded (rlhf/parallel/fsdp.py turns it on)
        fused=not any(p.is_meta for p in params),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_multiplier(config, total_steps))
    return optimizer, scheduler


def lr_multiplier(config: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    # the longer of a fixed count and a fraction of the run (PPO paper §5.1: the first 10% of steps)
    warmup = max(0, config.warmup_steps, math.ceil(config.warmup_fraction * total_steps))
    floor = config.min_lr_ratio

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if config.schedule == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * (1 - progress)  # linear

    return multiplier
