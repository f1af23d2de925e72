"""OpenAI chat messages <-> the policy's chat template: normalized messages, prompts rendered with
the template (tools included), and tool calls parsed out of the policy's text, one parser for all:

    Qwen2.5, Hermes    <tool_call>{"name": "f", "arguments": {...}}</tool_call>   (one block per call)
    SmolLM2            <tool_call>[{"name": "f", "arguments": {...}}, ...]</tool_call>
    Llama 3.x          {"name": "f", "parameters": {...}}   (the whole turn, after an optional <|python_tag|>)

Tools are rendered by the template's own `tools=` argument when the template reads `tools`; else
they are listed in a system message with the `<tool_call>` format."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rlhf.data.tokenize import plain_chat_text

_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


class RequestError(ValueError):
    """A request the server cannot answer as it stands (HTTP 400, the message names the field)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # canonical JSON of the arguments object (sorted keys), what matching compares

    def openai(self, call_id: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def template(self) -> dict[str, Any]:
        """The form chat templates read: arguments as a mapping (Qwen2.5 and Llama 3.1 `tojson` them)."""
        return {"type": "function", "function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True)
class Message:
    """One chat message, normalized: what two requests must agree on to share a recorded turn."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    def same_turn(self, other: Message) -> bool:
        """`other` is this message as a client sent it back: the same role, the same text (clients
        may strip it), the same calls (ids and argument spacing aside)."""
        if self.role != other.role or self.tool_calls != other.tool_calls:
            return False
        if self.role == "assistant":
            return self.content.strip() == other.content.strip()
        return self == other

    def template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.template() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


def canonical_arguments(arguments: Any, where: str) -> str:
    """Arguments (a JSON string, as OpenAI sends them, or a mapping) as canonical JSON."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise RequestError(f"{where}: the arguments are not JSON ({err})") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}: the arguments must be a JSON object, got {arguments!r}")
    return json.dumps(arguments, sort_keys=True)


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, joined
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content):
            return "".join(parts)
    raise RequestError(f"{where}.content must be a string or a list of text parts, got {content!r}")


def normalize_messages(messages: Any) -> tuple[Message, ...]:
    """The request's `messages`, checked and normalized."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            raise RequestError(f"{where} must be an object with a role of system, user, assistant or tool")
        calls = []
        for j, call in enumerate(m.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise RequestError(
                    f"{where}.tool_calls[{j}] must be {{type: function, function: {{name, arguments}}}}"
                )
            calls.append(
                ToolCall(function["name"], canonical_arguments(function.get("arguments", {}), where))
            )
        role = "system" if m["role"] == "developer" else m["role"]
        out.append(
            Message(
                role,
                _text(m.get("content"), where),
                tuple(calls),
                str(m.get("tool_call_id") or ""),
                str(m.get("name") or ""),
            )  # fmt: skip
        )
    return tuple(out)


def template_reads_tools(tokenizer: Any) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """The tools listed for a template without a `tools` argument, in the `<tool_call>` format."""
    listed = "\n".join(json.dumps(t.get("function", t), sort_keys=True) for t in tools)
    return (
        "You may call these tools:\n<tools>\n" + listed + "\n</tools>\nCall one as "
        '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>.'
    )


def render(
    tokenizer: Any, messages: tuple[Message, ...], tools: list[dict[str, Any]] | None, generation: bool
) -> str:
    """The conversation as the chat template writes it (`generation`: with the assistant's opening)."""
    rendered = [m.template() for m in messages]
    kwargs: dict[str, Any] = {}
    if not getattr(tokenizer, "chat_template", None):  # no template: "role: content" blocks
        system = [{"role": "system", "content": tools_system_text(tools)}] if tools else []
        return plain_chat_text(system + [_plain(m) for m in messages], add_generation_prompt=generation)
    if tools and template_reads_tools(tokenizer):
        kwargs["tools"] = tools
    elif tools:
        listed = tools_system_text(tools)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {**rendered[0], "content": rendered[0]["content"] + "\n\n" + listed}
        else:
            rendered.insert(0, {"role": "system", "content": listed})
    try:
        return str(
            tokenizer.apply_chat_template(
                rendered, tokenize=False, add_generation_prompt=generation, **kwargs
            )
        )
    except Exception as err:  # jinja's TemplateError, or a template's raise_exception
        raise RequestError(f"the policy's chat template rejected the messages ({err})") from None


def _plain(m: Message) -> dict[str, Any]:
    calls = "".join(f"<tool_call>{json.dumps(c.template()['function'])}</tool_call>" for c in m.tool_calls)
    return {"role": m.role, "content": m.content + calls}


def parse_tool_calls(text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """(the text outside the calls, the calls) of a policy turn; a block that is not a call of the
    known forms stays in the text."""
    calls: list[ToolCall] = []

    def as_calls(raw: str, bare: bool = False) -> list[ToolCall] | None:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return None
        found = []
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            if bare and not ({"arguments", "parameters"} & set(item)):  # a JSON answer is no call
                return None
            arguments = item.get("arguments", item.get("parameters", {}))
            try:
                found.append(ToolCall(item["name"], canonical_arguments(arguments, "a tool call")))
            except RequestError:
                return None
        return found

    def take(match: re.Match[str]) -> str:
        found = as_calls(match.group(1).strip())
        if found is None:
            return str(match.group(0))
        calls.extend(found)
        return ""

    rest = _TOOL_BLOCK.sub(take, text)
    if calls:
        return rest.strip(), tuple(calls)
    bare = text.strip().removeprefix(_PYTHON_TAG).strip()  # Llama 3.x: the turn is the call
    if bare.startswith("{") and (found := as_calls(bare, bare=True)):
        return "", tuple(found)
    return text, ()
