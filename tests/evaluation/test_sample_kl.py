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


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_length_sorted_batches_return_each_prompts_greedy_answer_in_file_order(tiny, batch_size):
    """sample_responses batches prompts by length and hands the rollouts back in file order,
    `batch_size` rows each: every row is its prompt's greedy answer decoded alone, with its
    log-probs and EOS flag, in `generate`'s layout."""
    from rlhf.models.sampling import generate

    tok, policy, _, prompts = tiny
    greedy = SamplingConfig(max_new_tokens=5, do_sample=False)
    rollouts, texts = sample_responses(policy, tok, prompts, greedy, seed=0, batch_size=batch_size)
    assert [len(r.input_ids) for r in rollouts] == [
        min(batch_size, len(prompts) - s) for s in range(0, len(prompts), batch_size)
    ]
    rows = [(r, i) for r in rollouts for i in range(len(r.input_ids))]
    assert len(rows) == len(prompts) == len(texts)
    for k, (rollout, row) in enumerate(rows):
        alone = generate(
            policy, torch.tensor([prompts[k]]), torch.ones(1, len(prompts[k]), dtype=torch.long), greedy,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, return_logprobs=False,
        )  # fmt: skip
        prompt, response = unpadded(tok, rollout, row)
        assert prompt == prompts[k]
        assert response == alone.response_ids[0][alone.response_mask[0].bool()].tolist()
        assert bool(rollout.ended_with_eos[row]) == bool(alone.ended_with_eos[0])
        real = rollout.attention_mask[row, rollout.prompt_length :]
        assert torch.equal(real.float(), rollout.response_mask[row])  # one turn: real == response
        assert real.tolist() == sorted(real.tolist(), reverse=True)  # right-padded responses
        ended = int(alone.ended_with_eos[0])
        assert texts[k] == tok.decode(response[: len(response) - ended], skip_special_tokens=True).strip()


def test_rows_regrouped_in_file_order_keep_their_sampler_logprobs():
    """in_file_order moves each row's tokens, masks and sampler log-probs unchanged into the file's
    order and a new left/right padding (a row of a narrower batch lands flush right in the prompt
    block), each output batch cut to its own widths."""
    from rlhf.evaluation.judging import in_file_order
    from rlhf.models.sampling import Rollout

    wide = Rollout(
        input_ids=torch.tensor([[0, 5, 6, 7, 8, 0], [9, 9, 9, 4, 0, 0]]),
        attention_mask=torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]),
        prompt_length=3,
        response_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        ended_with_eos=torch.tensor([False, True]),
        logprobs=torch.tensor([[-0.5, -0.25, 0.0], [-2.0, 0.0, 0.0]]),
        decode_steps=2,
    )
    narrow = Rollout(
        input_ids=torch.tensor([[3, 2]]), attention_mask=torch.tensor([[1, 1]]), prompt_length=1,
        response_mask=torch.tensor([[1.0]]), ended_with_eos=torch.tensor([True]),
        logprobs=torch.tensor([[-1.0]]), decode_steps=1,
    )  # fmt: skip
    # the batches hold prompts 1, 2 (wide) and 0 (narrow): file order is narrow, wide 0, wide 1
    (joined,) = in_file_order([wide, narrow], order=[1, 2, 0], batch_size=3, pad_token_id=0)
    assert joined.prompt_length == 3 and joined.decode_steps == 3  # decode steps add up
    assert joined.input_ids.tolist() == [[0, 0, 3, 2, 0], [0, 5, 6, 7, 8], [9, 9, 9, 4, 0]]
    assert joined.attention_mask.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert joined.response_mask.tolist() == [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]
    assert joined.logprobs.tolist() == [[-1.0, 0.0], [-0.5, -0.25], [-2.0, 0.0]]
    assert joined.ended_with_eos.tolist() == [True, False, True]
    first, second = in_file_order([wide, narrow], order=[1, 2, 0], batch_size=1, pad_token_id=0)[:2]
    assert first.input_ids.tolist() == [[3, 2]] and first.logprobs.tolist() == [[-1.0]]  # its own widths
    assert second.input_ids.tolist() == [[5, 6, 7, 8]] and second.prompt_length == 2
