"""A world with rm_* options: the trainer RL runs with sees the distorted scores (and logs them as
its raw scores); the default world gets RLTrainer itself."""

from __future__ import annotations

import copy

import torch

from rlhf.demo.world_scores import trainer_class
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from rlhf.worlds import WorldConfig
from tests.support.train_testing import metric_rows, rl_config


def test_the_default_world_trains_with_rltrainer_itself():
    assert trainer_class(WorldConfig()) is RLTrainer


def test_a_scaled_world_feeds_rl_the_scaled_scores(tok, prompts, _models, tmp_path):
    world = WorldConfig(rm_scale=3.0, rm_scale_drift=0.5)
    # one score call per iteration: forwards not split in halves
    config = rl_config("ppo_max", train={"iterations": 2}, runtime={"split_forwards": False})
    policy, reward_model = copy.deepcopy(_models)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    seen = []
    original = roles.reward_model.score
    roles.reward_model.score = lambda sequences: seen.append(original(sequences)) or seen[-1]
    runtime = LocalRuntime(roles, config.runtime)
    trainer = trainer_class(world)(config, runtime, prompts, run_dir=tmp_path / "run", quiet=True)
    assert isinstance(trainer, RLTrainer) and type(trainer) is not RLTrainer
    trainer.train()
    rows = metric_rows(tmp_path / "run", kinds=("iteration",))
    assert [r["iteration"] for r in rows] == [0, 1]
    # the reward model's own scores, by iteration (one call each: no critic pre-training in TINY)
    assert len(seen) == 2 and isinstance(seen[0], torch.Tensor)
    for row, scores, factor in zip(rows, seen, (3.0, 4.5)):  # 3 x (1 + 0.5 x iteration)
        torch.testing.assert_close(
            torch.tensor(row["reward/raw_scores"]), scores * factor, rtol=1e-4, atol=1e-4
        )  # logged rounded
