"""The OpenAI-compatible server over the sampler, driven by the real `openai` client: a two-turn
episode with a tool call whose trained tokens and log-probs are exactly the sampler's, the tool's
tokens context (mask 0); concurrent requests decoded in one batch as they are one at a time; an
edited history starting a new segment; the schema's errors."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import torch
from openai import BadRequestError

from rlhf.agents import Batcher, ChatServer, Settings, load_agent, model_backend, run_agent_episodes
from rlhf.config import AgentConfig
from rlhf.models.tiny import tiny_causal_lm
from tests.support.agents_testing import call_chain, chat_tokenizer, openai_client, scripted_llama, stop_ids


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


class Recorded:
    """A backend that keeps every batch it sampled (the sampler's own record)."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __call__(self, contexts, sampling, max_new_tokens):
        rollout = self.backend(contexts, sampling, max_new_tokens)
        self.calls.append((contexts, rollout))
        return rollout


def backend_of(tok, model):
    return Recorded(model_backend(model, tok.pad_token_id, stop_ids(tok)))


def test_a_tool_calling_episode_trains_on_exactly_the_sampled_tokens(tok):
    sampler = backend_of(tok, scripted_llama(tok, call_chain(tok)))
    episodes = run_agent_episodes(
        load_agent("tests.support.agents_testing:tool_agent"), sampler, tok, [{}], AgentConfig(),
        max_new_tokens=16, max_tokens=64, honours_sampling=True, return_logprobs=True,
    )  # fmt: skip
    assert episodes.rewards.tolist() == [1.0] and episodes.failures == []
    counts = episodes.metrics()
    assert counts["agent/turns_mean"] == 2 and counts["agent/tool_calls_mean"] == 2
    assert counts["agent/segments_mean"] == 1
    rollout = episodes.rollout
    (first_context, first), (second_context, second) = [(c[0], r) for c, r in sampler.calls]
    # the prompt is the first request's rendering; the second request's context is the trajectory
    assert rollout.prompt_ids[0].tolist() == first_context
    response = rollout.response_ids[0][rollout.attention_mask[0, rollout.prompt_length :].bool()]
    assert second_context == first_context + response[: len(second_context) - len(first_context)].tolist()
    policy = rollout.response_mask[0].bool()
    sampled = torch.cat([first.response_ids[0], second.response_ids[0]])
    assert torch.equal(response[policy[: len(response)]], sampled)  # token ids: the sampler's
    assert torch.equal(rollout.logprobs[0][policy], torch.cat([first.logprobs[0], second.logprobs[0]]))
    assert bool((rollout.logprobs[0][policy] < -0.1).all())  # real log-probs, not 0s
    chain = [tok.convert_tokens_to_ids(t) for t in call_chain(tok)[1:]]
    assert sampled.tolist() == chain + chain  # the call, twice (greedy: temperature 0 honoured)
    context = rollout.attention_mask[0, rollout.prompt_length :].bool() & ~policy
    assert (
        tok.decode(rollout.response_ids[0][context])
        == "<|im_start|> tool 5 <|im_end|> <|im_start|> assistant"
    )
    assert rollout.logprobs[0][context].eq(0).all()
    assert episodes.turn_rewards[0].sum() == 1.0 and episodes.turn_rewards[0, policy.nonzero().max()] == 1.0


@contextmanager
def served(tok, backend, target: int, **batcher):
    """A server whose batches are sampled on a thread of their own, once `target` requests wait."""
    batch = Batcher(backend, window_s=batcher.get("window_s", 5.0), honours_sampling=True)
    server = ChatServer(tok, batch, Settings("tiny", max_new_tokens=6))
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            ready = batch.take(target, 0.05)
            if ready:
                batch.run(ready)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield openai_client(server.url + "/v1")
    finally:
        stop.set()
        thread.join()
        server.close()


def test_concurrent_requests_are_decoded_in_one_batch_as_one_at_a_time(tok):
    model = tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2)
    prompts = ["a", "b c d e", "what is 2 plus 3 ?", "f g"]  # different lengths: left padding

    def ask(client, i, out):
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompts[i]}], temperature=0, logprobs=True
        )
        out[i] = (reply.choices[0].message.content, [t.logprob for t in reply.choices[0].logprobs.content])

    together, alone = {}, {}
    backend = backend_of(tok, model)
    with served(tok, backend, target=len(prompts)) as client:
        threads = [threading.Thread(target=ask, args=(client, i, together)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [len(contexts) for contexts, _ in backend.calls] == [4]  # one sampler call for the four
    single = backend_of(tok, model)
    with served(tok, single, target=1) as client:
        for i in range(len(prompts)):
            ask(client, i, alone)
    assert [len(contexts) for contexts, _ in single.calls] == [1, 1, 1, 1]
    assert [together[i][0] for i in range(4)] == [alone[i][0] for i in range(4)]  # the same tokens
    for i in range(4):
        assert together[i][1] == pytest.approx(alone[i][1], abs=1e-4)


def test_an_edited_history_starts_a_new_segment(tok):
    sampler = backend_of(tok, tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2))
    episodes = run_agent_episodes(
        load_agent("tests.support.agents_testing:editing_agent"), sampler, tok, [{}], AgentConfig(),
        max_new_tokens=4, max_tokens=64, return_logprobs=True,
    )  # fmt: skip
    assert episodes.metrics()["agent/segments_mean"] == 2 and episodes.failures == []
    rollout = episodes.rollout  # the trajectory is the last segment: the edited prompt, one turn
    (_, _), ([second_context], second) = sampler.calls
    assert rollout.prompt_ids[0].tolist() == second_context and "edited" in tok.decode(second_context)
    assert rollout.response_mask[0].sum() == second.response_mask[0].sum() and episodes.turns.tolist() == [1]


def test_the_schema_and_its_errors(tok):
    model = tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2)
    with served(tok, backend_of(tok, model), target=1, window_s=0.0) as client:
        assert [m.id for m in client.models.list().data] == ["tiny"]
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a b"}], n=2, max_tokens=2, stop=["zzz"]
        )
        assert len(reply.choices) == 2 and all(c.finish_reason in ("stop", "length") for c in reply.choices)
        assert all(len((c.message.content or "").split()) <= 2 for c in reply.choices)
        for bad, message in (({"temperature": -1}, "temperature must be a number >= 0"),
                             ({"stream": True}, "stream: true is not supported"),
                             ({"top_p": 2.0}, "top_p must be in (0, 1]")):  # fmt: skip
            with pytest.raises(BadRequestError, match=message.replace("(", r"\(").replace("]", r"\]")):
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "a"}], **bad
                )
