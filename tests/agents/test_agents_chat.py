"""Tool calls read in the formats of the common chat templates, messages normalized as clients send
them back, tools rendered by the template (or listed in a system turn when it reads none)."""

from __future__ import annotations

import json
import re

import pytest

from rlhf.agents.chat import Message, RequestError, ToolCall, normalize_messages, parse_tool_calls, render
from tests.support.agents_testing import TOOLS, chat_tokenizer

ADD = ToolCall("add", json.dumps({"a": 2, "b": 3}, sort_keys=True))


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"b": 3, "a": 2}}\n</tool_call>', "", (ADD,)),  # Qwen2.5
        ('Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
         '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "Let me add.", (ADD, ADD)),
        ('<tool_call>[{"name": "add", "arguments": {"a": 2, "b": 3}}]</tool_call>', "", (ADD,)),  # SmolLM2
        ('<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}', "", (ADD,)),  # Llama 3.x
        ('{"name": "add", "parameters": {"a": 2, "b": 3}}', "", (ADD,)),
        ('{"name": "Bob"}', '{"name": "Bob"}', ()),  # a JSON answer is no call
        ("<tool_call> not json </tool_call>", "<tool_call> not json </tool_call>", ()),
        ("the sum is 5", "the sum is 5", ()),
        ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}', "", (ADD,)),  # cut before the close
    ],
)  # fmt: skip
def test_tool_calls_are_read_in_each_templates_format(text, content, calls):
    assert parse_tool_calls(text) == (content, calls)


def test_messages_are_normalized_and_answers_match_as_sent_back():
    sent = [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{"b":3,"a":2}'}}]},
        {"role": "tool", "tool_call_id": "x", "content": "5"},
    ]  # fmt: skip
    system, call, tool = normalize_messages(sent)
    assert system == Message("system", "be brief") and tool == Message("tool", "5", tool_call_id="x")
    assert call.same_turn(Message("assistant", "", (ADD,)))  # ids and argument spacing aside
    assert Message("assistant", " hi ").same_turn(Message("assistant", "hi"))
    assert not Message("assistant", "hi").same_turn(Message("assistant", "hi there"))
    for bad, where in (([], "non-empty"), ([{"role": "robot"}], "messages[0]"),
                       ([{"role": "user", "content": 3}], "messages[0].content"),
                       ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
                        "not JSON")):  # fmt: skip
        with pytest.raises(RequestError, match=re.escape(where)):
            normalize_messages(bad)


def test_tools_are_rendered_by_the_template_or_listed_in_a_system_turn():
    tok = chat_tokenizer()
    messages = (Message("user", "what is 2 plus 3 ?"),)
    assert "tools: add" in render(tok, messages, TOOLS, generation=True)
    tok.chat_template = tok.chat_template.replace("tools", "tool_list")  # a template without tools
    listed = render(tok, messages, TOOLS, generation=True)
    assert listed.startswith("<|im_start|>system\nYou may call these tools:") and '"name": "add"' in listed
    tok.chat_template = None  # none at all: "role: content" blocks
    plain = render(tok, (*messages, Message("assistant", "", (ADD,))), None, generation=False)
    assert plain.endswith('assistant: <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')


def test_the_context_after_a_turn_is_the_templates_text_less_the_sampled_end():
    """After a turn that ended with the template's end-of-turn token, the context is what the
    template writes after it, then the new turns and the generation prompt; a turn cut short gets
    the whole closing (the end-of-turn marker included) as context."""
    from rlhf.agents.trajectory import Trajectory

    tok = chat_tokenizer()
    tok.chat_template = (  # a closing with a space before its end token, as some templates write
        "{% for m in messages %}{{ m.role }} {{ m.content }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}assistant{% endif %}"
    )
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = {w: tok.convert_tokens_to_ids(w) for w in ("user", "assistant", "a", "b", "tool", "5")}
    first = (Message("user", "a"),)
    for ended, closing in ((True, []), (False, [end])):
        trajectory = Trajectory(tok)
        prepared = trajectory.prepare(first, None, "")
        assert prepared.context == [ids["user"], ids["a"], end, ids["assistant"]]
        turn = [ids["b"], end] if ended else [ids["b"]]
        state = trajectory.record(prepared, turn, [-0.5] * len(turn), ended, Message("assistant", "b"))
        trajectory.answered(state, 0)
        follow = trajectory.prepare((*first, Message("assistant", "b"), Message("tool", "5")), None, "")
        assert follow.base is state and follow.new_tokens == [
            *closing,
            ids["tool"],
            ids["5"],
            end,
            ids["assistant"],
        ]
        assert follow.context == [*prepared.context, *turn, *follow.new_tokens]
        edited = trajectory.prepare((*first, Message("assistant", "a"), Message("tool", "5")), None, "")
        assert edited.base is None  # an answer the record does not hold: a new segment
