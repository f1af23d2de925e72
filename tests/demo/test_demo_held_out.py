"""The demo's held-out evaluation of an RL run (rlhf/demo/held_out.py) goes through the trainer's
runtime by role name, never through the roles' modules (under Ray or torchrun the roles
live elsewhere), and gives the figures of the same evaluation on the modules themselves."""

from __future__ import annotations

import random

import pytest
import torch

from rlhf.data.tokenize import encode_prompt
from rlhf.demo.held_out import ModulesInProcess, evaluate_policy
from rlhf.demo.run import rl_evaluator
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from rlhf.worlds import build_world
from tests.support.train_testing import rl_config

MAX_NEW_TOKENS = 6


class RecordingRuntime:
    """The trainer's runtime, each call of the evaluator's seam recorded; it has no other member
    (the trainer holds no roles: an evaluator reaching for anything else fails)."""

    def __init__(self, runtime) -> None:
        self.runtime, self.calls = runtime, []

    def sample(self, prompts, sampling, seed):
        self.calls.append(("sample", seed, sampling.temperature))
        return self.runtime.sample(prompts, sampling, seed)

    def forward(self, role, sequences, temperature=None):
        self.calls.append(("forward", role, temperature))
        return self.runtime.forward(role, sequences, temperature)


@pytest.fixture(scope="module")
def world_run(tmp_path_factory):
    world = build_world()
    tok = world.tokenizer
    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    reward_model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2), head_init_std=0.5
    )
    config = rl_config("ppo_max", out=tmp_path_factory.mktemp("held_out"))
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    texts = [ex["prompt"] for ex in world.sft_examples(8, random.Random(0))]
    ids = [encode_prompt(tok, t, 64) for t in texts]
    trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), ids, quiet=True)
    return world, reward_model, trainer, texts, ids


def test_the_rl_evaluator_reaches_the_roles_only_through_the_runtime(world_run):
    world, reward_model, trainer, texts, ids = world_run
    roles = trainer.runtime.roles
    with torch.no_grad():  # the policy moved off its reference: KL is not 0
        for p in roles.policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    plain = ModulesInProcess(roles.policy.model, roles.reference.reference, reward_model, world.tokenizer)
    expected, expected_samples, gold = evaluate_policy(
        plain, world.tokenizer, world, texts, ids, seed=1003, max_new_tokens=MAX_NEW_TOKENS
    )
    history, samples = [], {}
    evaluator = rl_evaluator(world.tokenizer, world, texts, ids, 3, MAX_NEW_TOKENS, history, samples)
    recording = RecordingRuntime(trainer.runtime)
    trainer.runtime = recording
    try:
        record = evaluator(trainer, 4)
    finally:
        trainer.runtime = recording.runtime
    assert recording.calls == [
        ("sample", 1003, 1.0),  # the eval seed, 1000 + the run's seed; temperature 1
        ("forward", "reward_model", None),
        ("forward", "policy", 1.0),
        ("forward", "reference", 1.0),
    ]
    assert history == [{"iteration": 4, **record}] and samples["end"] == expected_samples
    # the same responses: gold, length and distinct-2 equal; log-probs and scores to float rounding
    assert record["gold"] == float(gold.mean()) == expected["gold"]
    for key in ("length", "distinct2", "eos_rate", "topic_rate", "repetition_rate"):
        assert record[key] == expected[key], key
    assert expected["kl"] > 0.01
    for key in ("kl", "ppl", "proxy"):
        assert record[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
