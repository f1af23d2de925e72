"""CISPO (MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
arXiv 2506.13585 §3.1, eq. 4-5; docs/algorithms.md §42): a REINFORCE loss whose tokens are weighted
by a clipped importance weight with no gradient, so that no token drops out of the gradient as it
does where PPO's clip binds:

    r = exp(logp - old_logp),  w = sg(clip(r, 1 - clip_eps, 1 + clip_eps_high))
    loss = token mean of -w * A * logp

clip_eps None: no lower bound (the paper sets eps_low large and tunes eps_high only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.losses import MAX_LOG_RATIO, LossOutput, _approx_kl_old_new, _require, register_policy_loss
from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked, masked_max, masked_mean, masked_min


@register_policy_loss(
    "cispo", settings=lambda c: {"clip_eps_high": c.clip_eps_high, "clip_eps": c.cispo_clip_eps_low}
)
def cispo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_high: float | None = None,
    clip_eps: float | None = None,
) -> LossOutput:
    """CISPO's loss (module docstring), a token mean. `clip_eps_high` is required (the ScaleRL recipe,
    Khatri et al. 2025 arXiv 2510.13786, caps w at 5: clip_eps_high 4.0).

    Stats: weight_clip_fraction (tokens whose w was clipped, either bound), clip_fraction_high (r above
    1 + clip_eps_high), clip_fraction_low (r below 1 - clip_eps), ratio_mean/min/max, approx_kl.
    """
    if clip_eps_high is None or not clip_eps_high > 0:
        raise ValueError(f"cispo clip_eps_high must be > 0 (e.g. 4.0: w <= 5), got {clip_eps_high}")
    if clip_eps is not None and not 0 < clip_eps <= 1:
        raise ValueError(f"cispo clip_eps must be in (0, 1] or None (no lower bound), got {clip_eps}")
    old_logp = _require(
        old_logp, "old_logp", "cispo", "the importance weight is against the behaviour policy"
    )
    check_same_shape(logp, "logp", old_logp=old_logp, ref_logp=ref_logp, advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    logp, adv = fill_masked(logp, valid), fill_masked(advantages, valid)
    with torch.no_grad():
        ratio = fill_masked(logp - old_logp, valid).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        low = None if clip_eps is None else 1.0 - clip_eps
        weight = ratio.clamp(min=low, max=1.0 + clip_eps_high)
        above = ratio > 1.0 + clip_eps_high
        below = torch.zeros_like(valid) if low is None else ratio < low
    loss = masked_mean(-weight * adv * logp, valid)
    with torch.no_grad():
        stats = {
            "weight_clip_fraction": masked_mean((above | below).float(), valid),
            "clip_fraction_high": masked_mean(above.float(), valid),
            "clip_fraction_low": masked_mean(below.float(), valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_min": masked_min(ratio, valid),
            "ratio_max": masked_max(ratio, valid),
            **_approx_kl_old_new(old_logp, logp, valid),
        }
    return loss, stats
