"""A trained module's optimizer: AdamW with its warmup/decay schedule, global gradient clipping and
the NaN/inf guard (PPO paper §5.4, appendix C.2; docs/algorithms.md §19)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlhf.config import OptimConfig


class Optimizer:
    """AdamW over the trainable `params` with the schedule over `total_steps` (`build_optimizer`) and
    `optim.max_grad_norm` (`clip_and_step`); `adamw` and `schedule` are torch's objects."""

    def __init__(self, params: Iterable[torch.Tensor], optim: OptimConfig, total_steps: int) -> None:
        self.adamw, self.schedule = build_optimizer(params, optim, total_steps)
        self.max_grad_norm = optim.max_grad_norm
        self.released = False  # the AdamW moments freed at the end of a sharded run (`release_state`)

    @property
    def lr(self) -> float:
        return float(self.schedule.get_last_lr()[0])

    @property
    def steps_taken(self) -> int:
        """Optimizer steps taken so far (the schedule's count; a skipped step is not counted)."""
        return int(self.schedule.last_epoch)

    def trainable(self) -> list[torch.Tensor]:
        return [q for group in self.adamw.param_groups for q in group["params"]]

    def check_not_released(self) -> None:
        if self.released:
            raise RuntimeError(
                "the optimizer state was released at the end of the run: resume from its checkpoint"
            )

    def step(self, keep_gradients: bool = False) -> float:
        """Clip, step and drop (or with `keep_gradients` zero) the gradients; the pre-clip norm."""
        self.check_not_released()
        return clip_and_step(self.adamw, self.schedule, self.trainable(), self.max_grad_norm, keep_gradients)

    def release_state(self) -> None:
        """Free AdamW's moments once the run is over and its checkpoint holds them (a sharded run's
        export then gathers whole weights with that memory free); a later step would be refused."""
        self.adamw.state.clear()
        self.released = True

    def state_dict(self, with_moments: bool = True) -> dict[str, Any]:
        """The schedule's state and AdamW's (None without `with_moments`: a sharded run's moments go
        to each rank's checkpoint shards, rlhf/rundir/sharded_checkpoint.py)."""
        optimizer = self.adamw.state_dict() if with_moments else None
        return {"optimizer": optimizer, "scheduler": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["optimizer"] is not None:  # None: loaded from the checkpoint's shards
            self.adamw.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        if state["optimizer"] is None:  # the moments came from the shards; the current lr (which the
            # optimizer's own state would carry) is the schedule's last one, not the lr of step 0
            for group, lr in zip(self.adamw.param_groups, self.schedule.get_last_lr()):
                group["lr"] = lr


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
