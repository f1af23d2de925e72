"""The three kinds of examples the trainers consume.

A prompt is either a string (used verbatim, e.g. an HH "\\n\\nHuman: ...\\n\\nAssistant:" transcript)
or a list of chat messages `{"role": ..., "content": ...}` (rendered by `tokenize.render_prompt`).
Responses are plain strings; the EOS token is added at tokenization, never stored here.
`source` records the file and line of the example for error messages; it takes no part in equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from rlhf.data.errors import Source

Message = dict[str, str]
Prompt = Union[str, list[Message]]  # noqa: UP007 (a runtime alias, valid on Python 3.10)

KINDS = ("prompt", "sft", "preference")


@dataclass
class PromptExample:
    """A prompt for generation (RL rollouts, evaluation)."""

    prompt: Prompt
    source: Source | None = field(default=None, compare=False)


@dataclass
class SFTExample:
    """A prompt and the demonstration response to imitate."""

    prompt: Prompt
    response: str
    source: Source | None = field(default=None, compare=False)


@dataclass
class PreferenceExample:
    """A prompt with a preferred (`chosen`) and a dispreferred (`rejected`) response."""

    prompt: Prompt
    chosen: str
    rejected: str
    source: Source | None = field(default=None, compare=False)


Example = Union[PromptExample, SFTExample, PreferenceExample]  # noqa: UP007


def prompt_key(prompt: Prompt) -> str:
    """A string that identifies a prompt (for grouping examples that share one)."""
    if isinstance(prompt, str):
        return prompt
    return "\x00".join(f"{m['role']}\x01{m['content']}" for m in prompt)
