"""AdamW with a warmup + constant/cosine/linear schedule (its step, with global gradient-norm clipping
and the NaN/inf guard, is the learner's: rlhf/train/learner.py)."""

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
        # run's ranks but 0) has no kernel until it is sharded (rlhf/parallel/fsdp.py turns it on)
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
