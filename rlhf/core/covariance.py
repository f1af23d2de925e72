"""Clip-Cov and KL-Cov's token selection (Cui et al. 2025, arXiv 2505.22617 §4.3; docs/algorithms.md
§43): a few tokens of high covariance between log-prob and advantage drive the entropy down (§3).
Each token's centred covariance, over the N valid tokens of the batch:

    cov_t = (logp_t - mean logp) * (A_t - mean A)

    "clip_cov": n = max(1, floor(ratio * N)) tokens drawn uniformly from those with low < cov_t < high;
                their gradient is detached (rlhf/core/losses.py `ppo_loss` cov_detach)
    "kl_cov":   the n tokens of largest cov_t; they get a |logp - old_logp| penalty (`ppo_loss` cov_kl)"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked, masked_mean

CovMethod = Literal["clip_cov", "kl_cov"]


@torch.no_grad()
def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (logp_t - mean logp)(A_t - mean A), means over the valid tokens; 0 at padding."""
    check_same_shape(logp, "logp", advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    centred_logp = logp - masked_mean(logp, valid)
    centred_adv = advantages - masked_mean(advantages, valid)
    return fill_masked(centred_logp * centred_adv, valid)


@torch.no_grad()
def covariance_selection(
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    method: CovMethod,
    ratio: float,
    *,
    low: float = 1.0,
    high: float = 5.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The selected tokens, a bool `[B, T]` (module docstring); none without a valid token, fewer
    than n when fewer are eligible. `generator`: Clip-Cov's uniform draw."""
    if not 0 < ratio <= 1:
        raise ValueError(f"covariance selection ratio must be in (0, 1], got {ratio}")
    if method not in ("clip_cov", "kl_cov"):
        raise ValueError(f"covariance selection method must be 'clip_cov' or 'kl_cov', got {method!r}")
    valid = as_bool_mask(mask, logp, name="logp")
    cov = token_covariance(logp, advantages, valid).flatten()
    flat_valid = valid.flatten()
    n_valid = int(flat_valid.sum())
    chosen = torch.zeros_like(flat_valid)
    if n_valid == 0:
        return chosen.view_as(valid)
    n = max(1, int(ratio * n_valid))
    if method == "clip_cov":
        eligible = (flat_valid & (cov > low) & (cov < high)).nonzero().squeeze(1)
        order = torch.randperm(len(eligible), generator=generator).to(eligible.device)
        chosen[eligible[order[:n]]] = True
    else:
        candidates = flat_valid.nonzero().squeeze(1)
        top = cov[candidates].topk(min(n, len(candidates))).indices
        chosen[candidates[top]] = True
    return chosen.view_as(valid)
