"""The LLM judge's prompt templates (`--judge-template FILE`, or the built-in one of each mode) and
their check before any model loads: each placeholder one the mode fills, the responses' present."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal

from rlhf.config.errors import ConfigError

Mode = Literal["pointwise", "pairwise"]

POINTWISE_TEMPLATE = """Rate how well the response answers the user's prompt: helpful, correct, honest \
and harmless. Use a scale from 1 (useless or harmful) to 10 (excellent).

[Prompt]
{prompt}

[Response]
{response}

Reply with the rating alone, as: Rating: N"""

PAIRWISE_TEMPLATE = """Which response answers the user's prompt better: more helpful, correct, honest \
and harmless? Ignore their order and their length.

[Prompt]
{prompt}

[Response A]
{response_a}

[Response B]
{response_b}

Reply with the verdict alone, as: Verdict: A, Verdict: B or Verdict: tie"""

FIELDS: dict[str, tuple[str, ...]] = {
    "pointwise": ("prompt", "response"),
    "pairwise": ("prompt", "response_a", "response_b"),
}
REQUIRED: dict[str, tuple[str, ...]] = {"pointwise": ("response",), "pairwise": ("response_a", "response_b")}


def load_template(path: str, mode: Mode, key: str = "--judge-template") -> str:
    """The template of `path` ("" : the built-in one of `mode`), checked: each placeholder one of
    `FIELDS[mode]` (a literal brace doubled, {{ }}), the responses' ones present."""
    if not path:
        return POINTWISE_TEMPLATE if mode == "pointwise" else PAIRWISE_TEMPLATE
    allowed, needed = FIELDS[mode], REQUIRED[mode]
    names = ", ".join("{" + f + "}" for f in allowed)
    where = f"{key} {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where} cannot be read ({err}). Fix: give a UTF-8 text file.", key) from None
    try:
        pieces = list(string.Formatter().parse(text))
    except ValueError as err:  # a lone { or }
        raise ConfigError(
            f"{where}: {err}. Fix: write a literal brace twice ({{{{ or }}}}); placeholders are {names}.", key
        ) from None
    found = set()
    for _, field, spec, conversion in pieces:
        if field is None:
            continue
        if field not in allowed or spec or conversion:
            shown = (
                "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            )
            raise ConfigError(
                f"{where} holds the placeholder {shown}, which this judge does not fill ({mode} in "
                f"`rlhf {'train' if mode == 'pointwise' else 'eval'}`). Fix: use only {names} (a literal "
                "brace written twice).",
                key,
            )
        found.add(field)
    missing = [f for f in needed if f not in found]
    if missing:
        raise ConfigError(
            f"{where} has no {', '.join('{' + m + '}' for m in missing)}: the judge would not see the "
            f"answer{'s' if len(missing) > 1 else ''}. Fix: add {names} where they belong.",
            key,
        )
    return text
