"""The gap between the sampler's log-probs and the trainer's for the same tokens (numerics only, with
equal weights). With r = trainer_logp - sampler_logp on each valid response token:

    mismatch/kl             token mean of exp(r) - 1 - r: the k3 estimate of KL(sampler || trainer)
                            from tokens the sampler drew (>= 0; ~r^2/2 for a small gap)
    mismatch/max_ratio      exp(max |r|): the largest pi_trainer/pi_sampler or its inverse (>= 1)
    mismatch/mean_abs_diff  token mean of |r|

(docs/monitors.md#sampler-trainer-mismatch; NeMo-RL, prime-rl and slime log the same gap.)"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.losses import kl_estimate
from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked, masked_mean


def sampler_mismatch(sampler_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """{"mismatch/kl", "mismatch/max_ratio", "mismatch/mean_abs_diff"} over the valid tokens of
    `mask` (values at masked positions are never read); no valid token: 0, 1 and 0."""
    check_same_shape(sampler_logp, "sampler_logp", trainer_logp=trainer_logp, mask=mask)
    valid = as_bool_mask(mask, sampler_logp, name="sampler_logp")
    sampler, trainer = sampler_logp.float(), trainer_logp.float()
    gap = fill_masked(trainer, valid) - fill_masked(sampler, valid)  # 0 at masked positions
    kl = kl_estimate(sampler, trainer, kind="k3", mask=valid)  # k3 of (sampler - trainer): exp(r) - 1 - r
    return {
        "mismatch/kl": float(masked_mean(kl, valid)),
        "mismatch/max_ratio": float(torch.exp(gap.abs().max())) if gap.numel() else 1.0,
        "mismatch/mean_abs_diff": float(masked_mean(gap.abs(), valid)),
    }
