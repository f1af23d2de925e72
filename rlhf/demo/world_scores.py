"""The scores RL sees on a built-in world whose `rm_*` options distort the reward model's
(rlhf/worlds/reward_distortion.py): `rlhf demo` and `rlhf ablate` give their trainer this hook."""

from __future__ import annotations

import torch

from rlhf.rl.scorer import RawScoresHook
from rlhf.worlds import WorldConfig
from rlhf.worlds.reward_distortion import distort_scores


def world_scores_hook(world: WorldConfig, run_seed: int) -> RawScoresHook | None:
    """None for a world that distorts nothing (the default), else the raw-score hook of the run's
    Scorer (rlhf/rl/scorer.py) that distorts the raw scores: logged as such (`reward/raw_mean` is
    what RL saw), and shaped as every raw score is (truncation policy, overlong penalty)."""
    if not world.distorts_rewards:
        return None

    def distorted(raw_scores: torch.Tensor, iteration: int) -> torch.Tensor:
        return distort_scores(raw_scores, world, iteration=iteration, run_seed=run_seed)

    return distorted
