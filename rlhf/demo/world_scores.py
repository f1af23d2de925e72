"""The trainer for a built-in world whose `rm_*` options distort the reward model's scores as RL
sees them (rlhf/worlds/reward_distortion.py): `rlhf demo` and `rlhf ablate` build their trainer here."""

from __future__ import annotations

from rlhf.models.truncation import apply_truncation_policy
from rlhf.rl.trainer import RLTrainer
from rlhf.worlds import WorldConfig
from rlhf.worlds.reward_distortion import distort_scores


def trainer_class(world: WorldConfig) -> type[RLTrainer]:
    """RLTrainer itself for a world that distorts nothing (the default), else a subclass whose raw
    scores are the distorted ones (logged as such: `reward/raw_mean` is what RL saw)."""
    if not world.distorts_rewards:
        return RLTrainer

    class DistortedScoresTrainer(RLTrainer):
        def score(self, rollout):
            raw_scores, _, _ = super().score(rollout)
            seen = distort_scores(raw_scores, world, iteration=self.iteration, run_seed=self.config.seed)
            c = self.config.rollout
            scores, keep = apply_truncation_policy(
                seen, rollout.ended_with_eos, policy=c.truncated, penalty=c.truncation_penalty
            )
            return seen, scores, keep

    return DistortedScoresTrainer
