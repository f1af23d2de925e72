"""Fixtures of the trainer tests (tests/rl, tests/stages, tests/train, tests/runtime and others; a plugin of tests/conftest.py): a
20-word vocabulary, Llama models of hidden 32 with one layer, rollouts of 8 prompts and at most 5
new tokens. Models are built once per session and deep-copied per test, so a test may train them
freely.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.config import RLConfig
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from tests.support.train_testing import PROMPT_TEXTS, WORDS


@pytest.fixture(scope="session")
def tok():
    return word_tokenizer([" ".join(WORDS)])


@pytest.fixture(scope="session")
def prompts(tok) -> list[list[int]]:
    return [tok(text)["input_ids"] for text in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def _models(tok):
    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    with torch.no_grad():  # a larger EOS row: about half the responses end within 5 tokens
        generator = torch.Generator().manual_seed(0)
        policy.lm_head.weight[tok.eos_token_id] = 0.4 * torch.randn(32, generator=generator)
    reward_model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2), head_init_std=0.5
    )
    return policy, reward_model


@pytest.fixture()
def models(_models):
    """(policy, reward_model): fresh copies for this test."""
    return copy.deepcopy(_models)


@pytest.fixture()
def make_trainer(tok, prompts, _models, tmp_path):
    """`make_trainer(config, run_dir=None, resume=False, ptx=None, evaluator=None)` on fresh model copies."""

    def build(config: RLConfig, *, run_dir=None, resume: bool = False, ptx=None, evaluator=None) -> RLTrainer:
        policy, reward_model = copy.deepcopy(_models)
        roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
        return RLTrainer(
            config,
            LocalRuntime(roles, config.runtime),
            prompts,
            ptx_batches=ptx,
            evaluator=evaluator,
            run_dir=run_dir or tmp_path / "run",
            resume=resume,
            quiet=True,
        )

    return build
