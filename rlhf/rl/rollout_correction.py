"""Rollout correction in the loop (`rollout.correction.*`; docs/algorithms.md §44): each token's
surrogate weight in the Experience (`is_weights`, which multiply the advantages) composed of
decoupled PPO's staleness weight (§34) and the sampler -> trainer correction.

    synchronous:   w = rollout_correction(pi_trainer, pi_sampler)   (the staleness weight is 1)
    asynchronous:  the sampler's log-probs are the stale behaviour policy's, so pi_prox / pi_behav
                   (trainer over sampler) is staleness and numerics in one ratio: the correction's
                   level, mode and cap replace decoupled PPO's truncation on it, never applied twice
"""

from __future__ import annotations

import torch

from rlhf.config.rollout import RolloutCorrectionConfig
from rlhf.core import rollout_correction


def corrected_weights(
    settings: RolloutCorrectionConfig,
    is_weights: torch.Tensor,
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor | None,
    mask: torch.Tensor,
    asynchronous: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(each token's weight, the rollout_correction/* metrics): `is_weights` (the staleness weights,
    1 when synchronous) unchanged when the correction is off; else as the module docstring says."""
    if not settings.enabled:
        return is_weights, {}
    if sampler_logp is None:
        raise RuntimeError("rollout.correction needs the sampler's log-probs, but the rollout has none")
    weights, stats = rollout_correction(
        trainer_logp, sampler_logp, mask, level=settings.level, mode=settings.mode, cap=settings.cap
    )
    staleness = torch.ones_like(weights) if asynchronous else is_weights  # async: the same ratio, once
    return staleness * weights, {f"rollout_correction/{k}": v for k, v in stats.items()}
