"""GSPO (Zheng et al. 2025, arXiv 2507.18071 §4.1, eq. 5-7; docs/algorithms.md §41): PPO's clipped
surrogate on one importance ratio per response, the geometric mean of its token ratios. For row i
with n_i >= 1 valid tokens:

    A_i = mean of its advantages over its valid tokens  (GRPO's advantage: the same on each token)
    s_i = exp(mean over its valid tokens of (logp - old_logp))
    L_i = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_eps, 1 + clip_eps_high))

The loss is the mean of L_i over the rows with a valid token (unit "rows", rlhf/rl/roles/policy.py);
the gradient flows through s_i, so each token of row i gets (s_i / n_i) * A_i * d logp."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.losses import MAX_LOG_RATIO, LossOutput, _approx_kl_old_new, _require, register_policy_loss
from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked


@register_policy_loss(
    "gspo", settings=lambda c: {"clip_eps": c.clip_eps, "clip_eps_high": c.clip_eps_high}, unit="rows"
)
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = None,
) -> LossOutput:
    """GSPO's sequence-level clipped surrogate (module docstring); mean over rows with a valid token,
    0 when none. The paper's ranges: clip_eps 3e-4, clip_eps_high 4e-4 (GSPO paper §5.1).

    Stats over those rows: clip_fraction (rows where a bound binds), clip_fraction_low/high (A < 0
    below 1 - clip_eps / A > 0 above 1 + clip_eps_high), ratio_mean/min/max (of s_i), approx_kl
    (k3, old vs new, a token mean).
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not clip_eps > 0:
        raise ValueError(f"gspo clip_eps must be > 0, got {clip_eps}")
    if not eps_high > 0:
        raise ValueError(f"gspo clip_eps_high must be > 0 or None (= clip_eps), got {clip_eps_high}")
    old_logp = _require(old_logp, "old_logp", "gspo", "the sequence ratio is against the behaviour policy")
    check_same_shape(logp, "logp", old_logp=old_logp, ref_logp=ref_logp, advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    counts = valid.sum(dim=-1)  # n_i
    rows = counts > 0
    n = counts.clamp(min=1).to(logp.dtype)
    log_ratio = fill_masked(logp - old_logp, valid).sum(dim=-1) / n
    seq_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()  # s_i
    adv = fill_masked(advantages, valid).sum(dim=-1) / n  # A_i
    unclipped = -adv * seq_ratio
    clipped = -adv * seq_ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    per_row = torch.where(rows, torch.maximum(unclipped, clipped), 0.0)
    n_rows = int(rows.sum())
    loss = per_row.sum() / max(n_rows, 1)
    with torch.no_grad():
        bound = (clipped > unclipped) & rows
        share = 1.0 / max(n_rows, 1)
        ratios = seq_ratio[rows]
        stats = {
            "clip_fraction": bound.sum() * share,
            "clip_fraction_low": (bound & (adv < 0)).sum() * share,
            "clip_fraction_high": (bound & (adv > 0)).sum() * share,
            "ratio_mean": ratios.sum() * share,
            "ratio_min": ratios.min() if n_rows else torch.zeros(()),
            "ratio_max": ratios.max() if n_rows else torch.zeros(()),
            **_approx_kl_old_new(old_logp, fill_masked(logp, valid), valid),
        }
    return loss, stats
