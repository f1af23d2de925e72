"""Render prompts, tokenize prompts and responses, and truncate them to a budget.

The prompt is tokenized with the tokenizer's special tokens (a BOS when it uses one and the text does
not already start with it), the response without them, followed by EOS. With a chat template
(`chat_template`, rlhf.data.chat) HH transcripts and message lists are rendered with the generation
prompt and responses end with the end-of-turn token; `system_prompt` "none" drops the block a
template writes for its own default system prompt. Truncation rules: `encode_prompt` and
`encode_response`; each cut is counted in a `TruncationStats`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rlhf.data.chat import response_end_id, templated_messages, without_default_system
from rlhf.data.examples import Message, PreferenceExample, Prompt, SFTExample
from rlhf.data.formats import HH_ASSISTANT, HH_HUMAN

SYSTEM_PROMPTS = ("template", "none")  # data.system_prompt
_HH_TURN = re.compile(f"(?={re.escape(HH_HUMAN)}|{re.escape(HH_ASSISTANT)})")


@dataclass
class TruncationStats:
    """Counts of what truncation did; pass one object to many encode calls to total them."""

    prompts: int = 0  # prompts encoded
    prompts_turns_dropped: int = 0  # prompts that lost at least one oldest turn
    turns_dropped: int = 0  # whole turns dropped, over all prompts
    prompts_left_truncated: int = 0  # prompts cut from the left after dropping every droppable turn
    prompts_truncated: int = 0  # prompts that lost anything to the budget (turns, text or tokens)
    responses: int = 0  # responses encoded (a pair counts two)
    responses_truncated: int = 0  # responses cut on the right (they still end with EOS)
    pairs_identical_after_truncation: int = 0  # pairs whose chosen and rejected ids became equal

    def merge(self, other: TruncationStats) -> None:
        """Add the counts of `other` to this object."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    @property
    def prompts_truncated_share(self) -> float | None:
        """The share of prompts that lost anything to the budget; None when none was encoded."""
        return self.prompts_truncated / self.prompts if self.prompts else None

    def as_dict(self) -> dict[str, int | float | None]:
        return {**asdict(self), "prompts_truncated_share": self.prompts_truncated_share}

    def summary(self) -> str:
        """One line for logs: "prompts 3/10 truncated (30.0%): 3/10 had turns dropped (5 turns), 1/10
        left-truncated; responses 2/20 truncated"."""
        share = self.prompts_truncated_share
        return (
            f"prompts {self.prompts_truncated}/{self.prompts} truncated"
            + (f" ({share:.1%})" if share is not None else "")
            + f": {self.prompts_turns_dropped}/{self.prompts} had turns dropped ({self.turns_dropped} turns), "
            f"{self.prompts_left_truncated}/{self.prompts} left-truncated; "
            f"responses {self.responses_truncated}/{self.responses} truncated"
            + (
                f"; {self.pairs_identical_after_truncation} pairs identical after truncation"
                if self.pairs_identical_after_truncation
                else ""
            )
        )


# --- rendering ------------------------------------------------------------------------------------


def plain_chat_text(messages: list[Message], add_generation_prompt: bool = True) -> str:
    """The rendering used when the tokenizer has no chat template: "role: content" blocks
    separated by blank lines, then "assistant:" as the generation cue."""
    blocks = [f"{m['role']}: {m['content']}" for m in messages]
    if add_generation_prompt:
        blocks.append("assistant:")
    return "\n\n".join(blocks)


def render_prompt(
    tokenizer, prompt: Prompt, chat_template: bool | str = "auto", system_prompt: str = "template"
) -> str:
    """The prompt text: HH transcripts and messages through the tokenizer's chat template (with the
    generation prompt) when `chat_template` turns it on; else a string as is and messages as
    `plain_chat_text`."""
    messages = templated_messages(tokenizer, prompt, chat_template)
    if messages is not None:
        return _apply_template(tokenizer, messages, system_prompt)
    return prompt if isinstance(prompt, str) else plain_chat_text(prompt)


def _apply_template(tokenizer, messages: list[Message], system_prompt: str = "template") -> str:
    if system_prompt not in SYSTEM_PROMPTS:
        raise ValueError(
            f"data.system_prompt must be one of {SYSTEM_PROMPTS}, got {system_prompt!r}. Fix: "
            "--data.system_prompt template"
        )
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # jinja raises TemplateError (e.g. "roles must alternate")
        raise ValueError(
            f"the tokenizer's chat template rejected the prompt messages ({error}). Fix: give messages "
            "the template accepts (roles, order), or turn the template off (--data.chat_template false)"
        ) from error
    return text if system_prompt == "template" else without_default_system(tokenizer, text, messages)


# --- turns ----------------------------------------------------------------------------------------


def hh_turns(text: str) -> tuple[str, list[str]]:
    """Split an HH transcript into (preamble, turns); each turn starts with its "\\n\\nHuman:" or
    "\\n\\nAssistant:" marker, and "".join([preamble, *turns]) == text."""
    pieces = _HH_TURN.split(text)
    return pieces[0], [p for p in pieces[1:] if p]


@dataclass
class _Dialogue:
    """A prompt seen as a kept head, droppable turns, and a protected tail (from the last user turn)."""

    head: list
    turns: list
    is_assistant: list[bool]
    protected_from: int  # index in `turns` of the first turn that is never dropped
    join: Callable[[list, list], Prompt]


def _as_dialogue(prompt: Prompt) -> _Dialogue:
    if isinstance(prompt, str):
        preamble, turns = hh_turns(prompt)
        is_assistant = [t.startswith(HH_ASSISTANT) for t in turns]
        return _Dialogue(
            [preamble], turns, is_assistant, _last_user(is_assistant), lambda h, t: "".join(h + t)
        )
    system = 0
    while system < len(prompt) and prompt[system]["role"] == "system":
        system += 1
    turns = list(prompt[system:])
    is_assistant = [m["role"] == "assistant" for m in turns]
    return _Dialogue(list(prompt[:system]), turns, is_assistant, _last_user(is_assistant), lambda h, t: h + t)


def _last_user(is_assistant: list[bool]) -> int:
    users = [i for i, assistant in enumerate(is_assistant) if not assistant]
    return users[-1] if users else max(len(is_assistant) - 1, 0)


# --- encoding -------------------------------------------------------------------------------------


def _encode_rendered(
    tokenizer, prompt: Prompt, templated: bool, system_prompt: str = "template"
) -> list[int]:
    if templated:  # a chat template writes its own BOS text; adding special tokens would double it
        text = _apply_template(tokenizer, prompt, system_prompt)
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = prompt if isinstance(prompt, str) else plain_chat_text(prompt)
    bos = getattr(tokenizer, "bos_token", None)
    return list(tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos))))


def _shorten_oldest_message(
    tokenizer, dialogue: _Dialogue, start: int, ids: list[int], max_tokens: int, system_prompt: str
):
    """Cut tokens from the start of the oldest kept message's text until the templated prompt fits
    (a few tries: decoded text may re-tokenize differently); the template itself stays whole."""
    if start >= len(dialogue.turns):
        return ids
    oldest, rest = dialogue.turns[start], dialogue.turns[start + 1 :]
    content = list(tokenizer.encode(oldest["content"], add_special_tokens=False))
    for _ in range(4):
        overflow = len(ids) - max_tokens
        if overflow <= 0 or overflow >= len(content):
            break  # fits, or the text cannot absorb it (the caller cuts tokens instead)
        content = content[overflow:]
        shortened = {**oldest, "content": tokenizer.decode(content)}
        ids = _encode_rendered(tokenizer, dialogue.head + [shortened] + rest, True, system_prompt)
    return ids


def encode_prompt(
    tokenizer,
    prompt: Prompt,
    max_tokens: int | None = None,
    stats: TruncationStats | None = None,
    chat_template: bool | str = "auto",
    system_prompt: str = "template",
) -> list[int]:
    """Token ids of the rendered prompt, at most `max_tokens` (None: no limit).

    A prompt over its budget first loses its oldest whole turns (HH turns or chat messages), never
    the text before the first turn, the system messages, nor the last user turn and what follows;
    a dialogue never starts with an assistant turn after a drop, and a templated prompt is
    re-rendered after each drop. Still too long: a templated prompt loses the start of its oldest
    kept message's text; any other prompt has its tokens cut from the left, keeping BOS and the end
    (where the generation cue is)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    messages = templated_messages(tokenizer, prompt, chat_template)
    templated = messages is not None
    if templated:
        prompt = messages
    ids = _encode_rendered(tokenizer, prompt, templated, system_prompt)
    dropped, text_cut = 0, False
    if max_tokens is not None and len(ids) > max_tokens:
        dialogue = _as_dialogue(prompt)
        start = 0
        while len(ids) > max_tokens and start < dialogue.protected_from:
            start += 1
            while start < dialogue.protected_from and dialogue.is_assistant[start]:
                start += 1  # a dialogue starts with a user turn
            dropped = start
            kept = dialogue.join(dialogue.head, dialogue.turns[start:])
            ids = _encode_rendered(tokenizer, kept, templated, system_prompt)
        if templated and len(ids) > max_tokens:
            text_cut = True
            ids = _shorten_oldest_message(tokenizer, dialogue, start, ids, max_tokens, system_prompt)
    left_truncated = max_tokens is not None and len(ids) > max_tokens
    if left_truncated:
        keep_bos = int(bool(ids) and ids[0] == getattr(tokenizer, "bos_token_id", None))
        if max_tokens <= keep_bos:
            raise ValueError(
                f"max_tokens={max_tokens} leaves no room for the prompt after its BOS token; raise it"
            )
        ids = ids[:keep_bos] + ids[len(ids) - (max_tokens - keep_bos) :]
    if not ids:
        raise ValueError(f"the prompt {str(prompt)[:80]!r} encodes to no token; a prompt needs at least one")
    if stats is not None:
        stats.prompts += 1
        stats.prompts_turns_dropped += int(dropped > 0)
        stats.turns_dropped += dropped
        stats.prompts_left_truncated += int(left_truncated or text_cut)
        stats.prompts_truncated += int(dropped > 0 or left_truncated or text_cut)
    return ids


def eos_token_id(tokenizer) -> int:
    """The tokenizer's EOS id, or a clear error when it has none."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            "the tokenizer has no EOS token, so responses cannot be terminated. "
            "Fix: set tokenizer.eos_token (the model's end-of-sequence or end-of-turn token), "
            "e.g. with rlhf.models.loading.prepare_tokenizer"
        )
    return int(eos)


def encode_response(
    tokenizer,
    text: str,
    max_tokens: int | None = None,
    stats: TruncationStats | None = None,
    end_id: int | None = None,
) -> list[int]:
    """Token ids of the response (no special tokens) followed by `end_id`, at most `max_tokens` in all.

    `end_id` is EOS by default; a response to a chat-templated prompt ends with the template's
    end-of-turn token instead (`rlhf.data.chat.response_end_id`). A text that already ends with
    that token does not get a second one. A cut response keeps its first `max_tokens - 1` text
    tokens and still ends with `end_id`: the reward model reads its score at the last token and must
    always read it at an EOS, as on the policy's finished responses (the price: SFT on cut responses
    teaches an early stop, which `responses_truncated` counts).
    """
    eos = eos_token_id(tokenizer) if end_id is None else end_id
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 (room for EOS), got {max_tokens}")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if ids and ids[-1] == eos:
        ids.pop()
    truncated = max_tokens is not None and len(ids) + 1 > max_tokens
    if truncated:
        ids = ids[: max_tokens - 1]
    if stats is not None:
        stats.responses += 1
        stats.responses_truncated += int(truncated)
    return ids + [eos]


def encode_sft(
    tokenizer,
    example: SFTExample,
    max_prompt_tokens: int | None = None,
    max_response_tokens: int | None = None,
    stats: TruncationStats | None = None,
    chat_template: bool | str = "auto",
    system_prompt: str = "template",
) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids ending with EOS or the template's end-of-turn) of an SFT example."""
    end = response_end_id(tokenizer, example.prompt, chat_template)
    return (
        encode_prompt(tokenizer, example.prompt, max_prompt_tokens, stats, chat_template, system_prompt),
        encode_response(tokenizer, example.response, max_response_tokens, stats, end),
    )


def encode_pair(
    tokenizer,
    example: PreferenceExample,
    max_prompt_tokens: int | None = None,
    max_response_tokens: int | None = None,
    stats: TruncationStats | None = None,
    chat_template: bool | str = "auto",
    system_prompt: str = "template",
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, chosen ids, rejected ids) of a preference pair; both responses end with EOS (or
    the template's end-of-turn token when the prompt is chat-templated).

    Two responses that share their first `max_response_tokens - 1` tokens become identical; such
    a pair teaches the reward model nothing and is counted in `stats.pairs_identical_after_truncation`.
    """
    end = response_end_id(tokenizer, example.prompt, chat_template)
    prompt = encode_prompt(tokenizer, example.prompt, max_prompt_tokens, stats, chat_template, system_prompt)
    chosen = encode_response(tokenizer, example.chosen, max_response_tokens, stats, end)
    rejected = encode_response(tokenizer, example.rejected, max_response_tokens, stats, end)
    if stats is not None and chosen == rejected:
        stats.pairs_identical_after_truncation += 1
    return prompt, chosen, rejected
