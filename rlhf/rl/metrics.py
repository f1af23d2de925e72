"""Metrics over sampled responses that need no model: diversity."""

from __future__ import annotations

from typing import Any

import torch

from rlhf.models.sampling import Rollout
from rlhf.rl.experience import Experience


def distinct_n(response_ids: torch.Tensor, response_mask: torch.Tensor, n: int = 2) -> float:
    """Distinct-n: unique n-grams / total n-grams over all responses' real tokens (0 when there are none)."""
    grams: list[tuple[int, ...]] = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        tokens = [t for t, m in zip(ids, mask) if m]
        grams.extend(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return len(set(grams)) / len(grams) if grams else 0.0


def rollout_metrics(
    rollout: Rollout,
    experience: Experience,
    raw_scores: torch.Tensor,
    processed: torch.Tensor,
    keep: torch.Tensor,
    kl: torch.Tensor,
    kl_estimator: str,
    beta: float,
    *,
    with_values: bool = True,
) -> dict[str, Any]:
    """The monitors of one rollout (PPO paper §5.2): reward before and after processing, KL to
    the reference per response (the configured estimator and k3), perplexities, length, EOS rate,
    distinct-2, advantage/return/value statistics (value: `with_values`, a critic's run). KL means are
    over the responses kept for training."""
    import math

    from rlhf.core import kl_estimate, masked_mean, masked_sum, masked_var

    e, mask = experience, experience.response_mask
    lengths = rollout.response_mask.sum(1).float()
    kept = keep.float()

    def mean_over_kept(per_response: torch.Tensor) -> float:
        return float((per_response * kept).sum() / kept.sum().clamp(min=1))

    k3 = kl_estimate(e.old_logp, e.ref_logp, kind="k3", mask=mask)
    metrics = {
        "reward/raw_mean": float(raw_scores.mean()),
        "reward/raw_std": float(raw_scores.std()) if len(raw_scores) > 1 else 0.0,
        "reward/processed_mean": float(processed.mean()) if len(processed) else 0.0,
        "reward/processed_std": float(processed.std()) if len(processed) > 1 else 0.0,
        "reward/raw_scores": [round(float(s), 4) for s in raw_scores],
        f"kl/{kl_estimator}": mean_over_kept(masked_sum(kl, mask, dim=-1)),
        "kl/ref": mean_over_kept(masked_sum(kl, mask, dim=-1)),
        "kl/k3": mean_over_kept(masked_sum(k3, mask, dim=-1)),
        "kl/beta": float(beta),
        "policy_ppl": math.exp(-float(masked_mean(e.old_logp, mask))),
        "ref_ppl": math.exp(-float(masked_mean(e.ref_logp, mask))),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/eos_rate": float(rollout.ended_with_eos.float().mean()),
        "rollout/kept_fraction": float(kept.mean()) if len(kept) else 0.0,  # rollout.truncated drop
        "response/distinct2": distinct_n(rollout.response_ids, rollout.response_mask, n=2),
        "advantage/mean": float(masked_mean(e.advantages, mask)),
        "advantage/std": float(masked_var(e.advantages, mask, unbiased=False).sqrt()),
        "return/mean": float(masked_mean(e.returns, mask)),
    }
    if with_values:
        metrics["value/mean"] = float(masked_mean(e.old_values, mask))
    return metrics
