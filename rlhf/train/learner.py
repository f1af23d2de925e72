"""What every trained model owns, in the RL roles and the supervised stages alike: its module, AdamW
and schedule, the data-parallel ranks and sharding it trains under, and the optimizer step
(the ranks' gradients summed, global gradient clipping, step, zeroed gradients).

A learner gets its parallel strategy when it is built (`peers`, `strategy`: the supervised stages,
sharded per layer at once); the RL runtime of torchrun still sets `peers` on its roles and shards
them per layer (`shard_per_layer`) at their first use (rlhf/runtime/distributed.py), which the Ray
issue replaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.runtime import fsdp
from rlhf.runtime.peers import Peers
from rlhf.train.optim import build_optimizer, clip_and_step


class Learner:
    """`module` trained by AdamW over its trainable parameters with a warmup/decay schedule over
    `total_steps` and global gradient clipping (PPO paper §5.4, appendix C.2). With `peers`
    (data-parallel ranks, rlhf/runtime/peers.py) the gradients are summed over the ranks before
    clipping; with `strategy` "fsdp2" the module and its AdamW state are sharded over them per layer
    (every rank's shards from rank 0's module, `shard_per_layer`; `bf16_compute`: gathered in bf16)."""

    peers: Peers | None = None  # data-parallel ranks: gradients and stats summed over them
    sharded = None  # dist.strategy fsdp2: the sharded root of `module` (rlhf/runtime/fsdp.py)
    per_layer = False  # sharded per layer: gradients arrive reduce-scattered
    released = False  # the AdamW moments freed at the end of a sharded run (release_optimizer_state)

    def __init__(
        self,
        module: nn.Module,
        optim: OptimConfig,
        total_steps: int,
        *,
        peers: Peers | None = None,
        strategy: str = "none",
        bf16_compute: bool = False,
    ) -> None:
        self.module = module
        self.max_grad_norm = optim.max_grad_norm
        self.optimizer, self.scheduler = build_optimizer(module.parameters(), optim, total_steps)
        if peers is not None:
            self.peers = peers
            if strategy == "fsdp2":
                self.shard_per_layer(peers, bf16_compute)

    def shard_per_layer(self, peers: Peers, bf16_compute: bool = False, offload: bool = False) -> None:
        """Shard the module per decoder layer over `peers` (rlhf/runtime/fsdp.py), AdamW's state with
        it, every rank's shards filled from rank 0's module and state (the others' may be on the
        meta device)."""
        self.peers = peers
        self.sharded = fsdp.shard_from_rank0(self.module, peers, self.optimizer, bf16_compute, offload)
        self.per_layer = True

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
        if self.per_layer:
            return fsdp.step_shards(
                self.sharded, self.optimizer, self.scheduler, self.peers, self.max_grad_norm
            )
        if self.peers is not None:
            self.peers.sum_gradients(self.trainable())
        return clip_and_step(self.optimizer, self.scheduler, self.trainable(), self.max_grad_norm)

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
