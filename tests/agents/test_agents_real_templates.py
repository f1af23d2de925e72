"""The published chat templates of Qwen2.5, Llama 3.2 and SmolLM2 (tests/agents/chat_templates/, their
licences in NOTICE.md) through the agent server: a two-turn calculator episode driven by the real
`openai` client, on a byte-level BPE tokenizer trained on the fly with each model's special tokens.
The tool call the model writes in its template's format is parsed back (name and arguments), and
the episode's trajectory is token-exact: the second request's context is the first one's, the
sampled ids as they came, then the template's own text for the tool turn; decoded, the trajectory
is the template's rendering of the whole conversation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlhf.agents import Batcher, ChatServer, Settings, parse_tool_calls
from rlhf.agents.chat import template_reads_tools, tools_system_text
from rlhf.data.collate import left_pad
from rlhf.models.sampling import Rollout
from tests.support.agents_testing import openai_client

TEMPLATES = Path(__file__).parent / "chat_templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "the value of an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
QUESTION = "What is 7 * 18?"
ARGUMENTS = {"expression": "7 * 18"}


# per model: the template file, bos/eos/pad, other special tokens, added non-special tokens (as the
# published tokenizers have them: Qwen2.5's <tool_call> is an added token that is not special)
MODELS = {
    "qwen2.5": ("qwen2_5_instruct.jinja", None, "<|im_end|>", "<|endoftext|>", ["<|im_start|>"],
                ["<tool_call>", "</tool_call>"]),
    "llama3.2": ("llama3_2_instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
                 ["<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>", "<|eom_id|>"], []),
    "smollm2": ("smollm2_instruct.jinja", "<|im_start|>", "<|im_end|>", "<|endoftext|>", [], []),
}  # fmt: skip
# SmolLM2's template renders no tools or calls: its model writes a JSON list in <tool_call> tags
SMOLLM2_CALL = '<tool_call>[{"name": "calculator", "arguments": {"expression": "7 * 18"}}]</tool_call>'


def bpe_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE (lossless: decode(encode(text)) == text) trained on the template's renderings."""
    file, bos, eos, pad, specials, added = MODELS[name]
    template = (TEMPLATES / file).read_text()
    special = [t for t in (bos, eos, pad, *specials) if t]
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    model.train_from_iterator([template, QUESTION, SMOLLM2_CALL, json.dumps(TOOLS), "126"], trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=model, bos_token=bos, eos_token=eos, pad_token=pad,
                                  clean_up_tokenization_spaces=False)  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.add_tokens(added)
    tok.chat_template = template
    return tok


class Scripted:
    """A sampler that writes the given turns, one per call, and records the contexts it was given."""

    def __init__(self, tok, turns: list[list[int]]):
        self.tok, self.turns, self.contexts = tok, list(turns), []

    def __call__(self, contexts, sampling, max_new_tokens) -> Rollout:
        assert len(contexts) == 1
        self.contexts.append(contexts[0])
        turn = self.turns.pop(0)
        prompt, mask = left_pad(contexts, self.tok.pad_token_id)
        response = torch.tensor([turn])
        return Rollout(
            input_ids=torch.cat([prompt, response], 1),
            attention_mask=torch.cat([mask, torch.ones_like(response)], 1),
            prompt_length=prompt.shape[1],
            response_mask=torch.ones(1, len(turn)),
            ended_with_eos=torch.tensor([True]),
            logprobs=torch.full((1, len(turn)), -0.25),
        )


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def render(tok, messages, generation: bool) -> str:
    """The template's text, the tools given as the server gives them: to a template that reads
    `tools`, else listed in a system turn of their own."""
    if not template_reads_tools(tok):
        listed = [{"role": "system", "content": tools_system_text(TOOLS)}]
        return tok.apply_chat_template(listed + messages, tokenize=False, add_generation_prompt=generation)
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=generation)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_published_template_round_trips_a_tool_call_token_exactly(name):
    tok = bpe_tokenizer(name)
    eos = tok.eos_token
    user = {"role": "user", "content": QUESTION}
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": ARGUMENTS}}]}  # fmt: skip
    tool = {"role": "tool", "content": "126"}
    answer = {"role": "assistant", "content": "126"}
    if name == "smollm2":  # no tools in the template: the server lists them in a system turn
        assert not template_reads_tools(tok)
        written = SMOLLM2_CALL + eos
    else:  # what the model writes: its template's rendering of the call, up to its end of turn
        assert template_reads_tools(tok)
        opened = render(tok, [user], True)
        written = render(tok, [user, call], False)[len(opened) :]
        written = written[: written.index(eos) + len(eos)]
    turns = [encode(tok, written), encode(tok, "126" + eos)]
    assert tok.decode(turns[0]) == written  # lossless, the end-of-turn one special token
    sampler = Scripted(tok, turns)
    batcher = Batcher(sampler, window_s=0.0, honours_sampling=True)
    server = ChatServer(tok, batcher, Settings("tiny", max_new_tokens=256))
    stop = threading.Event()

    def decode() -> None:
        while not stop.is_set():
            batch = batcher.take(1, 0.02)
            if batch:
                batcher.run(batch)

    thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    try:
        url, episode = server.open_episode(max_turns=4, max_tokens=1024)
        client = openai_client(url)
        first = client.chat.completions.create(model="tiny", messages=[user], tools=TOOLS).choices[0]
        (made,) = first.message.tool_calls
        assert first.finish_reason == "tool_calls" and made.function.name == "calculator"
        assert json.loads(made.function.arguments) == ARGUMENTS
        reply = {"role": "tool", "tool_call_id": made.id, "content": "126"}
        messages = [user, first.message.model_dump(exclude_none=True), reply]
        second = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS).choices[0]
        assert second.message.content == "126" and not second.message.tool_calls
    finally:
        stop.set()
        thread.join()
        server.close()
    # the parser alone, on the text the server decodes (special tokens skipped)
    text, (parsed,) = parse_tool_calls(tok.decode(turns[0][:-1], skip_special_tokens=True))
    assert text == "" and parsed.name == "calculator" and json.loads(parsed.arguments) == ARGUMENTS
    # the first context is the template's prompt; the second: it, the sampled ids, the tool's turn
    first_context, second_context = sampler.contexts
    done = render(tok, [user, call], False)  # the template's text once the call is answered
    closing = done[done.rindex(eos) + len(eos) :]  # what it writes after the end of turn
    tool_turn = closing + render(tok, [user, call, tool], True)[len(done) :]
    assert first_context == encode(tok, render(tok, [user], True))
    assert second_context == first_context + turns[0] + encode(tok, tool_turn)
    state = episode.trajectory.last
    assert list(state.prompt) == first_context
    assert list(state.tokens) == second_context[len(first_context) :] + turns[1]
    assert state.policy == (True,) * len(turns[0]) + (False,) * len(encode(tok, tool_turn)) + (True,) * len(
        turns[1]
    )
    assert state.logprobs[len(turns[0])] == 0.0 and state.logprobs[0] == -0.25
    if name != "smollm2":  # decoded, the trajectory is the template's whole conversation
        whole = render(tok, [user, call, tool, answer], False)
        assert whole == tok.decode(list(state.prompt + state.tokens)) + closing
