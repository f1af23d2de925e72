"""A world with rm_* options: the trainer RL runs with sees the distorted scores (and logs them as
its raw scores), shaped as every raw score is; the default world gets no hook."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.demo.world_scores import world_scores_hook
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from rlhf.worlds import WorldConfig
from tests.support.train_testing import MAX_NEW_TOKENS, metric_rows, rl_config


def test_the_default_world_distorts_nothing():
    assert world_scores_hook(WorldConfig(), run_seed=0) is None


def world_trainer(world, config, tok, prompts, models, run_dir):
    """An RLTrainer with the world's hook, recording the reward model's own scores in `seen`."""
    policy, reward_model = copy.deepcopy(models)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    seen = []
    original = roles.reward_model.score
    roles.reward_model.score = lambda sequences: seen.append(original(sequences)) or seen[-1]
    hook = world_scores_hook(world, config.seed)
    trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), prompts, run_dir=run_dir, quiet=True,
                        raw_scores_hook=hook)  # fmt: skip
    return trainer, seen


def test_a_scaled_world_feeds_rl_the_scaled_scores(tok, prompts, _models, tmp_path):
    world = WorldConfig(rm_scale=3.0, rm_scale_drift=0.5)
    # one score call per iteration: forwards not split in halves
    config = rl_config("ppo_max", train={"iterations": 2}, runtime={"split_forwards": False})
    trainer, seen = world_trainer(world, config, tok, prompts, _models, tmp_path / "run")
    trainer.train()
    rows = metric_rows(tmp_path / "run", kinds=("iteration",))
    assert [r["iteration"] for r in rows] == [0, 1]
    # the reward model's own scores, by iteration (one call each: no critic pre-training in TINY)
    assert len(seen) == 2 and isinstance(seen[0], torch.Tensor)
    for row, scores, factor in zip(rows, seen, (3.0, 4.5)):  # 3 x (1 + 0.5 x iteration)
        torch.testing.assert_close(
            torch.tensor(row["reward/raw_scores"]), scores * factor, rtol=1e-4, atol=1e-4
        )  # logged rounded


def overlong_penalty_loop(length: int, max_length: int, buffer: int) -> float:
    """DAPO eq. 13, one response at a time (float64)."""
    if length <= max_length - buffer:
        return 0.0
    if length <= max_length:
        return (max_length - buffer - length) / buffer
    return -1.0


def test_a_world_shapes_its_scores_with_the_overlong_penalty_it_logs(tok, prompts, _models, tmp_path):
    world = WorldConfig(rm_scale=3.0)
    factor, share = 0.5, 0.6  # L_cache = round(0.6 x 5) = 3 tokens: lengths 3 to 5 are penalized
    config = rl_config("ppo_max", reward={"overlong_buffer": share, "overlong_penalty_factor": factor},
                       rollout={"truncated": "keep"}, runtime={"split_forwards": False})  # fmt: skip
    trainer, seen = world_trainer(world, config, tok, prompts, _models, tmp_path / "run")
    scored = trainer.rollouts.next_batch(0)
    lengths = scored.rollout.response_mask.sum(-1).long().tolist()
    penalties = [factor * overlong_penalty_loop(n, MAX_NEW_TOKENS, 3) for n in lengths]
    assert any(p < 0 for p in penalties), lengths  # the penalty is exercised
    torch.testing.assert_close(scored.raw_scores, seen[0] * 3.0, rtol=0, atol=1e-5)  # the world's scores
    expected = [float(r) + p for r, p in zip(scored.raw_scores.double(), penalties)]
    assert scored.scores.double().tolist() == pytest.approx(expected, abs=1e-6)
    assert scored.metrics["reward/overlong_penalty"] == pytest.approx(
        sum(penalties) / len(penalties), abs=1e-6
    )
