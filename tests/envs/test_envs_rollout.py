"""Multi-turn episodes (rlhf/envs/rollout.py): the layout against hand-written transcripts, the
batch of each turn, the turn and token limits, the sampler's log-probs against a forward over the
assembled rows, and the placement of per-turn rewards against a plain loop."""

from __future__ import annotations

import pytest
import torch

from rlhf.data.collate import left_pad
from rlhf.envs import EnvironmentClass, place_turn_rewards, run_episodes
from rlhf.models.logprobs import response_logprobs
from rlhf.models.sampling import Rollout, SamplingConfig, generate
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from tests.support.envs_testing import Echo

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([" ".join(WORDS)])


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


class Scripted:
    """A stand-in for the policy's `generate`: episode k (known by its prompt's first token) answers
    turn j with `turns[k][j]` (text; "<eos>" ends it); records the rows of every call."""

    def __init__(self, tok, prompts, turns):
        self.tok, self.calls = tok, []
        self.by_first = {p[0]: [ids(tok, t) for t in script] for p, script in zip(prompts, turns)}
        self.lengths = {p[0]: len(p) for p in prompts}

    def __call__(self, contexts: list[list[int]]) -> Rollout:
        self.calls.append(len(contexts))
        responses = []
        for c in contexts:
            done_turns = sum(1 for t in c[self.lengths[c[0]] :] if t == self.tok.eos_token_id)
            responses.append(self.by_first[c[0]][done_turns])
        width = max(len(r) for r in responses)
        prompt_ids, prompt_mask = left_pad(contexts, self.tok.pad_token_id)
        response = torch.full((len(contexts), width), self.tok.pad_token_id)
        mask = torch.zeros(len(contexts), width)
        for i, r in enumerate(responses):
            response[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1.0
        ended = torch.tensor([r[-1] == self.tok.eos_token_id for r in responses])
        return Rollout(
            torch.cat([prompt_ids, response], 1),
            torch.cat([prompt_mask, mask.long()], 1),
            prompt_ids.shape[1],
            mask,
            ended,
            logprobs=-mask * torch.arange(1, width + 1),
            decode_steps=width,
        )


def run(tok, prompts, turns, env_cls=Echo, **limits):
    gen = Scripted(tok, prompts, turns)
    envs = [env_cls({}) for _ in prompts]
    limits = {"max_turns": 3, "max_tokens": 100, **limits}
    return gen, run_episodes(
        gen, tok, prompts, envs, EnvironmentClass("t:E", env_cls), return_logprobs=True, **limits
    )


def test_the_layout_of_three_turns_with_replies_between(tok):
    prompts = [ids(tok, "a b"), ids(tok, "c")]
    turns = [["d <eos>", "e f <eos>", "g <eos>"], ["h i j <eos>", "n <eos>", "o p <eos>"]]
    gen, out = run(tok, prompts, turns)
    r = out.rollout
    # row 0: d <eos> | k l m | e f <eos> | k l m | g <eos>   (replies masked out of the response)
    expected = ids(tok, "d <eos> k l m e f <eos> k l m g <eos>")
    width = r.response_ids.shape[1]
    assert width == 15 and r.response_ids[0, : len(expected)].tolist() == expected
    policy = [1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1]
    assert r.response_mask[0].tolist() == policy + [0] * (width - len(policy))
    assert r.attention_mask[0, r.prompt_length :].tolist() == [1] * 13 + [0, 0]  # the model reads the replies
    assert r.response_mask[1].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert r.prompt_ids[1].tolist() == [tok.pad_token_id] + prompts[1]  # left-padded prompts
    # each turn's reward (its word count) at the turn's last token; the episode's sum
    assert out.turn_rewards[0].nonzero().flatten().tolist() == [1, 7, 12]
    assert out.turn_rewards[0, [1, 7, 12]].tolist() == [1.0, 2.0, 1.0]
    assert out.rewards.tolist() == [4.0, 6.0] and out.turns.tolist() == [3, 3] and out.done.all()
    # the sampler's log-probs land on the policy's tokens, 0 on the replies
    assert r.logprobs[0, :13].tolist() == [-1, -2, 0, 0, 0, -1, -2, -3, 0, 0, 0, -1, -2]
    assert r.ended_with_eos.all() and gen.calls == [2, 2, 2] and r.decode_steps == 4 + 3 + 3
    assert out.transcripts[0] == "d k l m e f k l m g"
    assert out.metrics()["env/reply_tokens_mean"] == 6.0


class StopAtA:
    def __init__(self, row):
        pass

    def step(self, response):
        return "s", 1.0, "a" in response.split()


def test_finished_episodes_leave_the_batch_and_no_reply_follows_the_last_turn(tok):
    prompts = [ids(tok, "b"), ids(tok, "c"), ids(tok, "d")]
    turns = [["a <eos>"], ["e <eos>", "a <eos>"], ["e <eos>", "f <eos>", "g <eos>", "h <eos>"]]
    gen, out = run(tok, prompts, turns, StopAtA, max_turns=3)
    assert gen.calls == [3, 2, 1]  # one batched call per turn, only the live episodes
    assert out.turns.tolist() == [1, 2, 3] and out.done.tolist() == [True, True, False]
    lengths = out.rollout.attention_mask[:, out.rollout.prompt_length :].sum(-1).tolist()
    assert lengths == [2, 5, 8]  # the third stops at max_turns: its reply "s" is not appended
    last = out.rollout.response_mask.shape[1] - 1 - out.rollout.response_mask.flip(-1).argmax(-1)
    assert (last + 1).tolist() == lengths  # every episode ends with a policy token


def test_the_token_budget_cuts_a_turn_and_ends_the_episode(tok):
    prompts = [ids(tok, "b")]
    gen, out = run(tok, prompts, [["c d <eos>", "e f g h <eos>"]], max_tokens=7)
    r = out.rollout
    assert r.attention_mask[0, r.prompt_length :].sum() == 7  # c d <eos> | k l m | e: cut at 7
    assert r.response_mask[0].tolist() == [1, 1, 1, 0, 0, 0, 1]
    assert not r.ended_with_eos[0] and out.turns.tolist() == [2] and gen.calls == [1, 1]
    # a reply that would not fit is not appended, and the episode ends after the turn
    gen, out = run(tok, prompts, [["c d <eos>", "e <eos>"]], max_tokens=5)
    assert out.rollout.response_mask[0].tolist() == [1, 1, 1] and gen.calls == [1]


def test_sampled_episodes_of_a_tiny_model_keep_the_samplers_logprobs(tok):
    """The real sampler through its public `generate`: each policy token's log-prob from the
    sampler (its own KV-cached context) equals a forward over the assembled row (the replies read
    as context), so the layout is the one the trainer's forwards read."""
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    with torch.no_grad():  # a likelier EOS: turns end within a few tokens
        model.lm_head.weight[tok.eos_token_id] += 1.0
    config = SamplingConfig(max_new_tokens=4)
    gen = torch.Generator().manual_seed(0)

    def sample(contexts):
        prompt_ids, prompt_mask = left_pad(contexts, tok.pad_token_id)
        return generate(model, prompt_ids, prompt_mask, config, tok.eos_token_id, tok.pad_token_id, gen, True)

    prompts = [ids(tok, text) for text in ("a b", "c", "d e f", "g")]
    out = run_episodes(sample, tok, prompts, [Echo({}) for _ in prompts], EnvironmentClass("t:E", Echo),
                       max_turns=3, max_tokens=20, return_logprobs=True)  # fmt: skip
    r = out.rollout
    assert (r.response_mask.sum() < r.attention_mask[:, r.prompt_length :].sum()).item()  # replies present
    logp, _ = response_logprobs(model, r.input_ids, r.attention_mask, r.prompt_length)
    policy = r.response_mask.bool()
    assert torch.allclose(logp[policy], r.logprobs[policy], atol=1e-5)
    assert not r.logprobs[~policy].any()


def loop_placement(rewards, turns, mask):
    """Plain loop: each earlier turn's reward moved from the row's last valid token to its place."""
    out = [list(row) for row in rewards]
    for b, (row, m) in enumerate(zip(turns, mask)):
        valid = [t for t, v in enumerate(m) if v]
        if not valid:
            continue
        for t in valid[:-1]:
            out[b][t] += row[t]
            out[b][valid[-1]] -= row[t]
    return out


def test_turn_placement_equals_a_plain_loop_and_keeps_each_rows_sum():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    turns = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, 8, generator=gen) < 0.7).double()
    mask[0] = 0.0
    placed = place_turn_rewards(rewards, turns, mask)
    expected = torch.tensor(
        loop_placement(rewards.tolist(), turns.tolist(), mask.tolist()), dtype=torch.float64
    )
    assert torch.allclose(placed, expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose((placed * mask).sum(-1), (rewards * mask).sum(-1))
