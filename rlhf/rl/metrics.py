"""Metrics of an iteration that need no model: the rollout monitors, diversity, an update's stats."""

from __future__ import annotations

from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.models.sampling import Rollout
from rlhf.rl.dapo import Scored
from rlhf.rl.experience import Experience
from rlhf.rl.groups import group_metrics


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


def experience_metrics(
    config: RLConfig,
    scored: Scored,
    experience: Experience,
    processed: torch.Tensor,
    kl: torch.Tensor,
    final_scores: torch.Tensor,
    beta: float,
    with_values: bool,
) -> dict[str, Any]:
    """The rollout monitors, group statistics when prompts are sampled in groups, and the metrics of
    the batch's sampling and scoring (`processed`: the kept rows' processed scores; `final_scores`:
    them in place, 0 elsewhere)."""
    keep = scored.keep
    metrics = rollout_metrics(scored.rollout, experience, scored.raw_scores, processed, keep, kl,
                              config.kl.estimator, beta, with_values=with_values)  # fmt: skip
    if config.rollout.samples_per_prompt > 1:
        assert experience.group is not None  # make_experience gives every row its prompt's group
        metrics.update(group_metrics(final_scores, experience.group, keep))
    return {**metrics, **scored.metrics}


def mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """The stats of an update from those of its optimizer steps: the mean over the steps that have a
    key (each step is one minibatch's token mean), `_max`/`_min` keys by max/min."""
    merged: dict[str, list[float]] = {}
    for stats in steps:
        for key, value in stats.items():
            merged.setdefault(key, []).append(value)
    out = {}
    for key, values in merged.items():
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out
