"""The proxy reward model's scores as RL sees them in a world with `rm_*` options: a scale that
drifts over the run and heavy-tailed errors, which reward normalization and clipping (PPO paper
§5.3.1) exist to correct. The gold reward is untouched, so a run that chases them shows it in gold.

    s'_i = rm_scale * (1 + rm_scale_drift * iteration) * s_i + o_i
    o_i  = rm_outlier_scale * tan(pi * (v_i - 1/2))  with probability rm_outlier_rate, else 0

The draws come from a generator seeded by the world seed, the run seed and the iteration: the same
iteration of two runs with the same seeds gets the same outliers (paired comparisons of PPO tricks)."""

from __future__ import annotations

import math

import torch

from rlhf.worlds.config import WorldConfig


def score_scale(config: WorldConfig, iteration: int) -> float:
    """The multiplier of the scores at RL `iteration` (0-based)."""
    return config.rm_scale * (1.0 + config.rm_scale_drift * iteration)


def distort_scores(
    scores: torch.Tensor, config: WorldConfig, *, iteration: int, run_seed: int
) -> torch.Tensor:
    """The scores [B] RL receives at `iteration`; `scores` itself when the world distorts nothing."""
    if not config.distorts_rewards:
        return scores
    out = scores.float() * score_scale(config, iteration)
    if config.rm_outlier_rate > 0:
        generator = torch.Generator().manual_seed(_draw_seed(config.seed, run_seed, iteration))
        u = torch.rand(len(scores), generator=generator)
        v = torch.rand(len(scores), generator=generator)
        cauchy = config.rm_outlier_scale * torch.tan(math.pi * (v - 0.5))
        out = out + torch.where(u < config.rm_outlier_rate, cauchy, torch.zeros_like(cauchy)).to(out.device)
    return out


def _draw_seed(world_seed: int, run_seed: int, iteration: int) -> int:
    return (world_seed * 1_000_003 + run_seed * 10_007 + iteration) % (2**63 - 1)
