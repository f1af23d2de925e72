"""eval.json's "kl" (rlhf/evaluation/sample_kl.py, docs/algorithms.md §38): the summed log-probs of
sampled answers against a plain loop (one unpadded row, one token at a time), the estimate against
its definition, 0 for a policy against itself."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.evaluation.judging import sample_responses
from rlhf.evaluation.sample_kl import response_logprob_sums, sample_kl
from rlhf.models.sampling import SamplingConfig
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

WORDS = "a b c d e f g h i j k l t".split()


def plain_logprob(model, prompt: list[int], response: list[int]) -> float:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    return sum(
        float(torch.log_softmax(logits[len(prompt) + t - 1], -1)[token]) for t, token in enumerate(response)
    )


@pytest.fixture(scope="module")
def tiny():
    tok = word_tokenizer([" ".join(WORDS)])
    policy = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    baseline = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
    gen = torch.Generator().manual_seed(0)
    ids = list(range(4, len(tok)))
    prompts = [[ids[int(i)] for i in torch.randint(len(ids), (1 + k % 4,), generator=gen)] for k in range(7)]
    return tok, policy, baseline, prompts


def unpadded(tok, rollout, row: int) -> tuple[list[int], list[int]]:
    prompt = rollout.input_ids[row, : rollout.prompt_length][
        rollout.attention_mask[row, : rollout.prompt_length].bool()
    ]
    response = rollout.response_ids[row][rollout.response_mask[row].bool()]
    return prompt.tolist(), response.tolist()


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_summed_logprobs_of_sampled_answers_match_a_plain_loop(tiny, batch_size):
    tok, policy, baseline, prompts = tiny
    sampling = SamplingConfig(max_new_tokens=5)
    rollouts, _ = sample_responses(policy, tok, prompts, sampling, seed=2, batch_size=batch_size)
    for model in (policy, baseline):
        sums = response_logprob_sums(model, rollouts)
        expected = [
            plain_logprob(model, *unpadded(tok, rollout, row))
            for rollout in rollouts
            for row in range(rollout.input_ids.shape[0])
        ]
        assert sums.dtype == torch.float64 and sums.shape == (len(prompts),)
        assert torch.allclose(sums, torch.tensor(expected, dtype=torch.float64), atol=1e-5)
    # left padding happened in a batch of several (the check above covered it)
    assert batch_size == 1 or any(bool((r.attention_mask[:, : r.prompt_length] == 0).any()) for r in rollouts)


def test_the_estimate_is_its_definition_and_zero_against_itself(tiny):
    tok, policy, baseline, prompts = tiny
    rollouts, _ = sample_responses(policy, tok, prompts, SamplingConfig(max_new_tokens=4), seed=0)
    own, other = response_logprob_sums(policy, rollouts), response_logprob_sums(baseline, rollouts)
    lengths = torch.cat([r.response_mask.sum(-1) for r in rollouts])
    sampling = {"temperature": 1.0, "top_p": 1.0, "do_sample": True}
    kl = sample_kl(own, other, lengths, sampling)
    ratios = [a - b for a, b in zip(own.tolist(), other.tolist())]
    mean = sum(ratios) / len(ratios)
    sd = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1))
    assert kl["n"] == len(prompts) and kl["tokens"] == int(lengths.sum())
    assert kl["mean"] == pytest.approx(mean, abs=1e-12)
    assert kl["ci95"] == pytest.approx([mean - 1.96 * sd / math.sqrt(7), mean + 1.96 * sd / math.sqrt(7)])
    assert kl["per_token"] == pytest.approx(sum(ratios) / int(lengths.sum()))
    assert kl["exact_in_expectation"] is True
    same = sample_kl(own, own.clone(), lengths, sampling)
    assert same["mean"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["per_token"] == 0.0
    tempered = sample_kl(own, other, lengths, {**sampling, "temperature": 0.7})
    assert tempered["exact_in_expectation"] is False and tempered["mean"] == kl["mean"]


def test_one_answer_and_no_answer():
    one = sample_kl(torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([4]), {"temperature": 1.0})
    assert one["mean"] == 2.0 and one["ci95"] is None and one["per_token"] == 0.5
    none = sample_kl(torch.zeros(0), torch.zeros(0), torch.zeros(0), {"temperature": 1.0})
    assert none["n"] == 0 and none["mean"] is None and none["per_token"] is None


def test_an_empty_response_sums_to_zero(tiny):
    tok, policy, _, prompts = tiny
    rollouts, _ = sample_responses(policy, tok, prompts[:2], SamplingConfig(max_new_tokens=3), seed=1)
    rollout = rollouts[0]
    rollout.response_mask = rollout.response_mask.clone()  # inference tensors are read-only
    rollout.attention_mask = rollout.attention_mask.clone()
    rollout.response_mask[0] = 0  # a row with nothing to score
    rollout.attention_mask[0, rollout.prompt_length :] = 0
    assert float(response_logprob_sums(policy, [rollout])[0]) == 0.0
