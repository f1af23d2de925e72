"""The runtime's calls for an evaluator (rlhf/runtime/protocol.py): `sample(prompts, sampling, seed)`
draws from its own seed and leaves the rollouts' random state alone; `forward(role, sequences,
temperature)` reads log-probs at the temperature asked. Under torchrun the ranks' shares of a
`sample` join into the one process's tokens."""

from __future__ import annotations

import pytest
import torch

from rlhf.data.collate import left_pad
from rlhf.models.logprobs import response_logprobs
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.tiny import word_tokenizer
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.runtime import runtime_for
from tests.support.dist_cases import tiny_models
from tests.support.ranks import run_ranks
from tests.support.train_testing import PROMPT_TEXTS, WORDS, rl_config

ROLLOUT_TEMPERATURE = 0.7  # the rollouts' own; the evaluator samples and reads at 1.0
HELD_OUT = SamplingConfig(max_new_tokens=5, temperature=1.0)


def tiny_runtime():
    """A ppo_max run's roles on fresh tiny models, and its runtime (distributed inside a group)."""
    tok = word_tokenizer([" ".join(WORDS)])
    policy, reward_model = tiny_models(tok)
    config = rl_config("ppo_max", rollout={"temperature": ROLLOUT_TEMPERATURE})
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    prompts = [tok(text)["input_ids"] for text in PROMPT_TEXTS[:8]]
    return roles, runtime_for(roles, config), prompts


def plain_sample(roles, prompts: list[list[int]], seed: int):
    """The closed form: rlhf.models.sampling.generate on the policy's model, a generator seeded `seed`."""
    tok = roles.tokenizer
    ids, mask = left_pad(prompts, tok.pad_token_id)
    generator = torch.Generator().manual_seed(seed)
    return generate(roles.policy.model, ids, mask, HELD_OUT, tok.eos_token_id, tok.pad_token_id, generator)


def held_out_tokens(seed: int) -> torch.Tensor:
    """The runtime's held-out sample of the tiny run's prompts (on each spawned rank)."""
    _, runtime, prompts = tiny_runtime()
    with torch.inference_mode():
        return runtime.sample(prompts, HELD_OUT, seed).input_ids


def test_sample_draws_from_its_own_seed_and_leaves_the_rollouts_generator_alone():
    roles, runtime, prompts = tiny_runtime()
    before = roles.policy.generator.get_state()
    with torch.inference_mode():
        first = runtime.sample(prompts, HELD_OUT, 7)
        again = runtime.sample(prompts, HELD_OUT, 7)
        other = runtime.sample(prompts, HELD_OUT, 8)
        expected = plain_sample(roles, prompts, 7)
    assert torch.equal(roles.policy.generator.get_state(), before)
    assert torch.equal(first.input_ids, expected.input_ids)
    assert torch.equal(first.attention_mask, expected.attention_mask)
    assert torch.equal(first.ended_with_eos, expected.ended_with_eos)
    assert torch.equal(again.input_ids, first.input_ids)
    assert not torch.equal(other.input_ids, first.input_ids)


def test_forward_reads_log_probs_at_the_temperature_asked_else_the_rollouts():
    roles, runtime, prompts = tiny_runtime()
    with torch.inference_mode():
        s = runtime.sample(prompts, HELD_OUT, 7).sequences
        for role in ("policy", "reference"):
            model = roles.policy.model if role == "policy" else roles.reference.model
            for asked, used in ((None, ROLLOUT_TEMPERATURE), (1.0, 1.0), (2.0, 2.0)):
                got = runtime.forward(role, s, temperature=asked)
                want = response_logprobs(model, s.input_ids, s.attention_mask, s.prompt_length, used)[0]
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # row chunks: float rounding
        assert runtime.forward("critic", s).shape == s.input_ids[:, s.prompt_length :].shape
        with pytest.raises(ValueError, match="temperature is for log-probs"):
            runtime.forward("critic", s, temperature=1.0)


@pytest.mark.slow
def test_two_ranks_sample_the_one_process_tokens():
    one = held_out_tokens(7)
    ranks = run_ranks(held_out_tokens, 7)
    assert all(torch.equal(tokens, one) for tokens in ranks)
