"""Rollouts sampled by an older policy than the one being trained (asynchronous RL): the decoupled
PPO correction (docs/algorithms.md §34; Hilton et al. 2022, "Batch size-invariance for policy
optimization"; AReaL, Fu et al. 2025)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.stats import as_bool_mask, fill_masked


def decoupled_is_weights(
    proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, truncation: float
) -> tuple[Tensor, dict[str, float]]:
    """Per-token importance weights min(pi_prox / pi_behav, truncation) [B, T], 0 at padding.

    pi_behav sampled the tokens (a policy some versions old); pi_prox is the policy at the start of
    this update, whose log-probs are PPO's "old" ones: the clipped ratio pi_theta / pi_prox keeps the
    update near pi_prox, and this weight corrects the expectation from pi_behav's samples to pi_prox's.
    Truncating it (at e.g. 2.0) bounds the variance, as truncated importance sampling does.
    Stats over the valid tokens: the weights' mean and max, the fraction truncated (0 without a valid token).
    """
    valid = as_bool_mask(mask, proximal_logp, name="proximal_logp")
    log_ratio = fill_masked(proximal_logp - behaviour_logp, valid)
    raw = torch.exp(log_ratio)
    weights = fill_masked(raw.clamp(max=truncation), valid)
    count = int(valid.sum())
    seen = weights.detach()
    stats = {
        "async/is_weight_mean": float(seen.sum() / count) if count else 0.0,
        "async/is_weight_max": float(seen.max()) if count else 0.0,
        "async/truncated_fraction": float((valid & (raw.detach() > truncation)).sum() / count)
        if count
        else 0.0,
    }
    return weights, stats
