"""AdamW with a warmup + constant/cosine/linear schedule, and global gradient-norm clipping."""

from __future__ import annotations

import math

import torch

from rlhf.config import OptimConfig


def build_optimizer(params, config: OptimConfig, total_steps: int):
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
        # run's ranks but 0) has no kernel until it is sharded (rlhf/runtime/fsdp.py turns it on)
        fused=not any(p.is_meta for p in params),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_multiplier(config, total_steps))
    return optimizer, scheduler


def lr_multiplier(config: OptimConfig, total_steps: int):
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


def clip_and_step(
    optimizer, scheduler, params, max_grad_norm: float | None, keep_gradients: bool = False
) -> float:
    """Clip the global gradient norm (docs/algorithms.md#19-global-gradient-clipping) when set, step, and
    return the pre-clip norm. The gradients are dropped after (AdamW skips a parameter that gets none
    in the next step), or with `keep_gradients` zeroed in place (DDP's bucket views, reused).
    A NaN or infinite norm skips the step (weights, AdamW's moments and the schedule unchanged): one
    such step would spread the NaN into every weight (algorithms.md §19)."""
    params = [p for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
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
    NaN/inf norm (rlhf/train/optim.py; averaged by `mean_over_steps` into the share of the update's
    steps skipped). A skipped step's norm is left out of the mean of the others."""
    skipped = not is_finite_norm(grad_norm)
    return {
        f"{prefix}/skipped_step_fraction": float(skipped),
        **({} if skipped else {f"{prefix}/grad_norm": grad_norm}),
    }
