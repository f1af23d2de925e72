"""Chat templates: when a prompt is rendered with the tokenizer's chat template, and the
end-of-turn token that then closes each response and stops generation.

The setting (`data.chat_template`): "auto" applies the template when the tokenizer has one,
True requires one, False never applies it (HH transcripts verbatim, message lists as
"role: content" blocks).

With the template on, an HH transcript ("\\n\\nHuman: ...\\n\\nAssistant: ...") becomes
user/assistant messages (text before its first turn, if any, a system message; the trailing
empty "Assistant:" cue becomes the template's generation prompt), message lists are rendered as
they are, and a plain string without HH turns is taken as already rendered and kept verbatim.
A response to a templated prompt ends with the template's end-of-turn token instead of EOS.
"""

from __future__ import annotations

import weakref

from rlhf.data.examples import Message, Prompt
from rlhf.data.formats import HH_ASSISTANT, HH_HUMAN

_PROBE = "\x00rlhf-probe\x00"  # a response text no template rewrites, to find what follows it
_END_OF_TURN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (template, id)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_on(tokenizer, setting: bool | str = "auto") -> bool:
    """Whether prompts are rendered with the tokenizer's chat template under `setting`."""
    if not (setting == "auto" or isinstance(setting, bool)):
        raise ValueError(
            f"data.chat_template must be 'auto', true or false, got {setting!r}. Fix: --data.chat_template auto"
        )
    if setting == "auto":
        return has_chat_template(tokenizer)
    if setting and not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise ValueError(
            f"data.chat_template is true but the tokenizer of {name!r} has no chat template. Fix: "
            "--data.chat_template auto (use it only when there is one) or false, or add a chat_template "
            "to that directory's tokenizer_config.json"
        )
    return bool(setting)


def hh_messages(text: str) -> list[Message] | None:
    """An HH transcript as chat messages; None when `text` has no HH turn.

    Each "\\n\\nHuman:" turn is a user message and each "\\n\\nAssistant:" turn an assistant
    message (contents stripped); an empty last Assistant turn (the generation cue) is dropped.
    """
    from rlhf.data.tokenize import hh_turns

    preamble, turns = hh_turns(text)
    if not turns:
        return None
    messages: list[Message] = [{"role": "system", "content": preamble.strip()}] if preamble.strip() else []
    for turn in turns:
        assistant = turn.startswith(HH_ASSISTANT)
        content = turn[len(HH_ASSISTANT if assistant else HH_HUMAN) :].strip()
        messages.append({"role": "assistant" if assistant else "user", "content": content})
    if messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    return messages


def templated_messages(tokenizer, prompt: Prompt, setting: bool | str = "auto") -> list[Message] | None:
    """The messages the template renders for `prompt`, or None when the prompt is used without it."""
    if not chat_template_on(tokenizer, setting):
        return None
    return list(prompt) if isinstance(prompt, list) else hh_messages(prompt)


def end_of_turn_id(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant message (e.g. <|im_end|>),
    found by rendering a probe dialogue; None when it writes none (then responses end with EOS)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    cached = _END_OF_TURN.get(tokenizer)
    if cached is not None and cached[0] == template:
        return cached[1]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}], tokenize=False
    )
    after = text[text.rindex(_PROBE) + len(_PROBE) :] if _PROBE in text else ""
    special = set(tokenizer.all_special_ids) | {
        i for i, token in tokenizer.added_tokens_decoder.items() if token.special
    }
    ids = tokenizer.encode(after, add_special_tokens=False) if after.strip() else []
    found = next((i for i in ids if i in special), None)
    _END_OF_TURN[tokenizer] = (template, found)
    return found


def response_end_id(tokenizer, prompt: Prompt, setting: bool | str = "auto") -> int:
    """The id that closes a response to `prompt`: the end-of-turn token when the prompt is
    rendered with the chat template (and the template has one), else EOS."""
    from rlhf.data.tokenize import eos_token_id

    if templated_messages(tokenizer, prompt, setting) is not None:
        end = end_of_turn_id(tokenizer)
        if end is not None:
            return end
    return eos_token_id(tokenizer)


def stop_token_ids(tokenizer, setting: bool | str = "auto") -> list[int]:
    """The ids that end a sampled response: EOS, and the end-of-turn token when the template is on."""
    from rlhf.data.tokenize import eos_token_id

    ids = [eos_token_id(tokenizer)]
    end = end_of_turn_id(tokenizer) if chat_template_on(tokenizer, setting) else None
    if end is not None and end not in ids:
        ids.append(end)
    return ids
