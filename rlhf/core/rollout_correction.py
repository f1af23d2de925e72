"""Rollout correction: importance weights from the sampler's numerics to the trainer's (docs/algorithms.md
§44; truncated importance sampling of Yao et al. 2025 and its masked and sequence-level variants).
With d = trainer_logp - sampler_logp on the valid tokens:

    level "token":    w_t = exp(d_t)
    level "sequence": w_i = exp(sum over the row's valid tokens of d_t), on each of its valid tokens
    mode "truncate":  min(w, cap)                                   (truncated IS: bias for variance)
    mode "mask":      w where 1/cap <= w <= cap, else 0             (masked IS: such tokens/rows dropped)

0 at padding; no gradient (the weights multiply the advantages, as decoupled PPO's do)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked

CorrectionLevel = Literal["token", "sequence"]
CorrectionMode = Literal["truncate", "mask"]
# a log-weight beyond this is clamped before exp (float32 overflows near 88); it is far past any cap
_MAX_LOG_WEIGHT = 60.0


@torch.no_grad()
def rollout_correction(
    trainer_logp: Tensor,
    sampler_logp: Tensor,
    mask: Tensor,
    level: CorrectionLevel = "token",
    mode: CorrectionMode = "truncate",
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """(weights [B, T], stats) as the module docstring says. Stats over the valid tokens (a sequence
    level's per row, over the rows with a valid token): weight_mean (of the applied weights),
    raw_weight_max (before the cap), truncated_fraction (mode truncate: above the cap) or
    masked_fraction (mode mask: outside [1/cap, cap]); 0 when nothing is valid."""
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout_correction level must be 'token' or 'sequence', got {level!r}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"rollout_correction mode must be 'truncate' or 'mask', got {mode!r}")
    if not cap > 1:
        raise ValueError(f"rollout_correction cap must be > 1, got {cap}")
    check_same_shape(trainer_logp, "trainer_logp", sampler_logp=sampler_logp)
    valid = as_bool_mask(mask, trainer_logp, name="trainer_logp")
    d = fill_masked(trainer_logp.float() - sampler_logp.float(), valid)
    if level == "sequence":
        d = d.sum(dim=-1, keepdim=True).expand_as(d)
    raw = fill_masked(d.clamp(max=_MAX_LOG_WEIGHT).exp(), valid)
    if mode == "truncate":
        out = raw > cap
        weights = raw.clamp(max=cap)
    else:
        out = valid & ((raw > cap) | (raw < 1.0 / cap))
        weights = torch.where(out, 0.0, raw)
    weights = fill_masked(weights, valid)
    units = valid if level == "token" else valid.any(dim=-1, keepdim=True)
    count = int(units.sum())

    def mean(x: Tensor) -> float:
        picked = x if level == "token" else x[:, :1]
        return float(fill_masked(picked, units).sum() / count) if count else 0.0

    stats = {
        "weight_mean": mean(weights),
        "raw_weight_max": float(raw[valid].max()) if count else 0.0,
        ("truncated_fraction" if mode == "truncate" else "masked_fraction"): mean(out.float()),
    }
    return weights.to(trainer_logp.dtype), stats
