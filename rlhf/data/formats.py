"""Record formats: detect which one a record is in, and turn a record into an example.
    prompt    {"prompt": P}            sft   {"prompt": P, "response"|"completion": R}
    messages  {"messages": [{"role", "content"}, ...]} (or ShareGPT "conversations"): the last
              assistant message is the response
    pairs     {"prompt": P, "chosen": R, "rejected": R}
    hh        {"chosen": D, "rejected": D}: HH-RLHF dialogues sharing all up to the last Assistant turn

P: a string or messages; R: a string or one assistant message; D: an HH transcript or messages. Extra
keys are ignored. A file serves a kind that needs less (a preference or SFT file gives prompts, a
preference file SFT examples: the chosen response); only the fields a kind uses are validated.
"""

from __future__ import annotations

from typing import Any

from rlhf.data.errors import DataError, Source
from rlhf.data.examples import (
    Example,
    Message,
    PreferenceExample,
    Prompt,
    PromptExample,
    SFTExample,
)

FORMATS = ("prompt", "sft", "messages", "pairs", "hh")
DEFAULT_KIND = {
    "prompt": "prompt",
    "sft": "sft",
    "messages": "sft",
    "pairs": "preference",
    "hh": "preference",
}
HH_HUMAN = "\n\nHuman:"
HH_ASSISTANT = "\n\nAssistant:"

_FORMAT_KEYS = {
    "prompt": '"prompt"',
    "sft": '"prompt" and "response" (or "completion")',
    "messages": '"messages" (a list of {"role", "content"})',
    "pairs": '"prompt", "chosen" and "rejected"',
    "hh": '"chosen" and "rejected" (whole HH dialogues)',
}
ROLES = ("system", "developer", "user", "assistant", "tool")  # the roles chat templates render
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_FORMAT_HINT = (
    "give each record the keys of one format: "
    + "; ".join(f"{name}: {keys}" for name, keys in _FORMAT_KEYS.items())
    + ", or name the format (--format)"
)


def detect_format(record: Any, source: Source) -> str:
    """The format of one record, from its keys."""
    record = _require_object(record, source)
    keys = set(record)
    if "messages" in keys or "conversations" in keys:
        return "messages"
    if "chosen" in keys and "rejected" in keys:
        return "pairs" if "prompt" in keys else "hh"
    if "prompt" in keys and ("response" in keys or "completion" in keys):
        return "sft"
    if "prompt" in keys:
        return "prompt"
    raise DataError(source, f"cannot tell the format from the keys {sorted(keys)}", _FORMAT_HINT)


def parse_record(record: Any, fmt: str, kind: str, source: Source) -> Example:
    """Turn one record of format `fmt` into an example of `kind` ("prompt" | "sft" | "preference")."""
    record = _require_object(record, source)
    if fmt == "prompt":
        if kind != "prompt":
            raise DataError(
                source,
                f"a prompt-only record has no response, but {kind} examples are needed",
                "use a file with responses (prompt/response, messages, or chosen/rejected), "
                "or use this file where prompts are needed (--kind prompt)",
            )
        return PromptExample(_prompt(record, "prompt", fmt, source), source=source)
    if fmt == "sft":
        return _parse_sft(record, kind, source)
    if fmt == "messages":
        return _parse_messages(record, kind, source)
    if fmt == "pairs":
        prompt = _prompt(record, "prompt", fmt, source)
        return _pair_as_kind(
            prompt,
            lambda: _response(record, "chosen", fmt, source),
            lambda: _response(record, "rejected", fmt, source),
            kind,
            source,
        )
    if fmt == "hh":
        chosen, rejected = _field(record, "chosen", fmt, source), _field(record, "rejected", fmt, source)
        prompt, chosen_response, rejected_response = split_hh_pair(chosen, rejected, source)
        return _pair_as_kind(
            prompt,
            lambda: _nonblank(chosen_response, "the chosen response (after the last Assistant turn)", source),
            lambda: _nonblank(
                rejected_response, "the rejected response (after the last Assistant turn)", source
            ),
            kind,
            source,
        )
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def split_hh_pair(chosen: Any, rejected: Any, source: Source) -> tuple[Prompt, str, str]:
    """Split two HH dialogues into (shared prompt, chosen response, rejected response).

    Transcripts: the prompt is everything through the last "\\n\\nAssistant:" (identical in both),
    each response is the rest with its leading spaces stripped. Message lists: the prompt is
    every message but the last, which must be the assistant's in both. Responses are not
    checked for emptiness here (a prompt-only caller does not need them).
    """
    if isinstance(chosen, str) and isinstance(rejected, str):
        chosen_prompt, chosen_response = _split_hh_transcript(chosen, "chosen", source)
        rejected_prompt, rejected_response = _split_hh_transcript(rejected, "rejected", source)
        if chosen_prompt != rejected_prompt:
            at = _first_difference(chosen_prompt, rejected_prompt)
            raise DataError(
                source,
                "the chosen and rejected dialogues differ before their last Assistant turn "
                f"(at character {at}: chosen has {chosen_prompt[max(0, at - 20) : at + 30]!r}, "
                f"rejected has {rejected_prompt[max(0, at - 20) : at + 30]!r}), so they answer different prompts",
                "make both dialogues identical up to the final '\\n\\nAssistant:', or drop the pair (--skip-invalid)",
            )
        return chosen_prompt, chosen_response, rejected_response
    if isinstance(chosen, list) and isinstance(rejected, list):
        chosen_messages = _messages(chosen, "chosen", source)
        rejected_messages = _messages(rejected, "rejected", source)
        for key, messages in (("chosen", chosen_messages), ("rejected", rejected_messages)):
            if messages[-1]["role"] != "assistant" or len(messages) < 2:
                raise DataError(
                    source,
                    f"field '{key}' must end with an assistant message that follows at least one prompt message",
                    "end each dialogue with the assistant's response",
                )
        if chosen_messages[:-1] != rejected_messages[:-1]:
            index = next(
                (i for i, (a, b) in enumerate(zip(chosen_messages[:-1], rejected_messages[:-1])) if a != b),
                min(len(chosen_messages), len(rejected_messages)) - 1,
            )
            raise DataError(
                source,
                f"the chosen and rejected dialogues differ before their last message (at message {index})",
                "make both dialogues identical except their final assistant message",
            )
        return chosen_messages[:-1], chosen_messages[-1]["content"], rejected_messages[-1]["content"]
    raise DataError(
        source,
        f"fields 'chosen' and 'rejected' must both be strings (HH transcripts) or both message lists, "
        f"got {type(chosen).__name__} and {type(rejected).__name__}",
        "store each dialogue as one '\\n\\nHuman: ...\\n\\nAssistant: ...' string or as a list of messages",
    )


# --- per-format parsing ---------------------------------------------------------------------------


def _parse_sft(record: dict, kind: str, source: Source) -> Example:
    prompt = _prompt(record, "prompt", "sft", source)
    if kind == "prompt":
        return PromptExample(prompt, source=source)
    if kind == "preference":
        raise _no_pairs(source, "an SFT record")
    key = "response" if "response" in record else "completion"
    return SFTExample(prompt, _response(record, key, "sft", source), source=source)


def _parse_messages(record: dict, kind: str, source: Source) -> Example:
    key = "messages" if "messages" in record else "conversations"
    messages = _messages(_field(record, key, "messages", source), key, source)
    if kind == "preference":
        raise _no_pairs(source, "a messages record")
    ends_with_response = messages[-1]["role"] == "assistant"
    if kind == "prompt":
        prompt = messages[:-1] if ends_with_response else messages
        if not prompt:
            raise DataError(
                source, f"field '{key}' holds no message before the assistant's", "add the user message"
            )
        return PromptExample(prompt, source=source)
    if not ends_with_response:
        raise DataError(
            source,
            f"the last message of '{key}' has role {messages[-1]['role']!r}, but an SFT record needs the "
            "assistant's response last",
            "end the conversation with the assistant message to learn, or use the file as prompts (--kind prompt)",
        )
    if len(messages) < 2:
        raise DataError(
            source, f"field '{key}' has no prompt message before the response", "add the user message"
        )
    return SFTExample(
        messages[:-1],
        _nonblank(messages[-1]["content"], f"the last message of '{key}'", source),
        source=source,
    )


def _pair_as_kind(prompt: Prompt, chosen, rejected, kind: str, source: Source) -> Example:
    """`chosen` and `rejected` are thunks, so only the responses a kind uses are validated."""
    if kind == "prompt":
        return PromptExample(prompt, source=source)
    if kind == "sft":
        return SFTExample(prompt, chosen(), source=source)
    chosen_text, rejected_text = chosen(), rejected()
    if chosen_text.strip() == rejected_text.strip():
        raise DataError(
            source,
            "the chosen and rejected responses are identical, so the pair says nothing about preference",
            "drop the pair (--skip-invalid) or fix one of the responses",
        )
    return PreferenceExample(prompt, chosen_text, rejected_text, source=source)


def _split_hh_transcript(dialogue: str, key: str, source: Source) -> tuple[str, str]:
    cut = dialogue.rfind(HH_ASSISTANT)
    if cut < 0:
        raise DataError(
            source,
            f"the {key} dialogue has no '\\n\\nAssistant:' turn",
            "write each dialogue as '\\n\\nHuman: ...\\n\\nAssistant: ...' ending with the Assistant's response",
        )
    end = cut + len(HH_ASSISTANT)
    response = dialogue[end:]
    if HH_HUMAN in response:
        raise DataError(
            source,
            f"the {key} dialogue ends with a Human turn, not an Assistant turn",
            "end each dialogue with the Assistant's response",
        )
    if not dialogue[:cut].strip():
        raise DataError(
            source, f"the {key} dialogue has no Human turn before its Assistant turn", "add the Human turn"
        )
    return dialogue[:end], response.lstrip(" ")


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# --- field validation -----------------------------------------------------------------------------


def _require_object(record: Any, source: Source) -> dict:
    if not isinstance(record, dict):
        raise DataError(
            source,
            f"a record must be a JSON object, got {type(record).__name__}",
            'write one object per record, e.g. {"prompt": "...", "response": "..."}',
        )
    return record


def _field(record: dict, key: str, fmt: str, source: Source) -> Any:
    value = record.get(key)
    if value is None and key in record:
        raise DataError(
            source,
            f"field '{key}' is null (format {fmt} needs {_FORMAT_KEYS[fmt]})",
            f"give '{key}' a value, or drop the record (--skip-invalid)",
        )
    if value is None:
        raise DataError(
            source,
            f"missing field '{key}' (format {fmt} needs {_FORMAT_KEYS[fmt]}; this record has {sorted(record)})",
            f"add '{key}' to the record, or pick the format that matches the file (--format)",
        )
    return value


def _prompt(record: dict, key: str, fmt: str, source: Source) -> Prompt:
    value = _field(record, key, fmt, source)
    if isinstance(value, str):
        return _nonblank(value, f"field '{key}'", source)
    if isinstance(value, list):
        return _messages(value, key, source)
    raise DataError(
        source,
        f"field '{key}' must be a string or a list of messages, got {type(value).__name__}",
        f'store \'{key}\' as text or as [{{"role": "user", "content": "..."}}]',
    )


def _response(record: dict, key: str, fmt: str, source: Source) -> str:
    value = _field(record, key, fmt, source)
    if isinstance(value, list):
        messages = _messages(value, key, source)
        if len(messages) != 1 or messages[0]["role"] != "assistant":
            raise DataError(
                source,
                f"field '{key}' must hold exactly one assistant message, got roles {[m['role'] for m in messages]}",
                f'store \'{key}\' as text or as [{{"role": "assistant", "content": "..."}}]',
            )
        value = messages[0]["content"]
    if not isinstance(value, str):
        raise DataError(
            source, f"field '{key}' must be a string, got {type(value).__name__}", f"store '{key}' as text"
        )
    return _nonblank(value, f"field '{key}'", source)


def _nonblank(text: str, what: str, source: Source) -> str:
    if not text.strip():
        raise DataError(
            source,
            f"{what} is empty",
            "give it some text, or drop the record (--skip-invalid)",
        )
    return text


def _messages(value: Any, key: str, source: Source) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise DataError(
            source,
            f"field '{key}' must be a non-empty list of messages, got {type(value).__name__}"
            + (" (empty)" if isinstance(value, list) else ""),
            f'write \'{key}\' as [{{"role": "user", "content": "..."}}, ...]',
        )
    messages: list[Message] = []
    for i, message in enumerate(value):
        if isinstance(message, dict) and "role" not in message and "from" in message:  # ShareGPT
            role = _SHAREGPT_ROLES.get(message["from"], message["from"])
            message = {"role": role, "content": message.get("value")}
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(
                source,
                f"message {i} of '{key}' must be an object with a string 'role'",
                'write each message as {"role": "user", "content": "..."}',
            )
        if message["role"] not in ROLES:  # a typo ("assitant") would render as another speaker's turn
            raise DataError(
                source,
                f"message {i} of '{key}' has role {message['role']!r}, which no chat template knows",
                "use one of " + ", ".join(ROLES),
            )
        content = message.get("content")
        if not isinstance(content, str):
            raise DataError(
                source,
                f"message {i} of '{key}' must have a string 'content', got {type(content).__name__}",
                "store the message text as a string (multimodal content parts are not supported)",
            )
        messages.append({"role": message["role"], "content": content})
    return messages


def _no_pairs(source: Source, what: str) -> DataError:
    return DataError(
        source,
        f"{what} has one response, but preference pairs are needed",
        "use a file with 'chosen' and 'rejected' responses, or use this file for SFT (--kind sft)",
    )
