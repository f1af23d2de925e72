"""Chat templates: when a prompt is rendered with the tokenizer's chat template, and the end-of-turn
token that then closes each response and stops generation.

`data.chat_template`: "auto" applies the template when the tokenizer has one, True requires one,
False never applies it (HH transcripts verbatim, message lists as "role: content" blocks). With it
on, an HH transcript becomes user/assistant messages (text before the first turn: a system message;
the trailing "Assistant:" cue: the generation prompt), message lists render as they are, a plain
string without HH turns is kept verbatim, and a response ends with the end-of-turn token, not EOS.
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


_USER_1, _ASSISTANT_1, _USER_2 = "\x00rlhf-u1\x00", "\x00rlhf-a1\x00", "\x00rlhf-u2\x00"
_DEFAULT_SYSTEM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (template, text)


def default_system_block(tokenizer) -> str:
    """The block the chat template writes for its own system prompt when the messages hold none
    (SmolLM2: "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM...<|im_end|>\\n"),
    without a leading BOS of its own; "" when it writes none, or when it cannot be told apart from the first
    user turn's opening.

    Found with probe dialogues: the text before a lone user message, less that message's opening,
    which is the text between an assistant message's end (a dialogue ending there) and the
    next user message."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return ""
    cached = _DEFAULT_SYSTEM.get(tokenizer)
    if cached is not None and cached[0] == template:
        return cached[1]

    def render(*contents: str) -> str:
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
        return tokenizer.apply_chat_template(messages, tokenize=False)

    block, user_opening = "", ""
    try:
        head = render(_USER_1).split(_USER_1)[0]
        closed = render(_USER_1, _ASSISTANT_1).split(_ASSISTANT_1)[1]
        between = render(_USER_1, _ASSISTANT_1, _USER_2).split(_ASSISTANT_1)[1].split(_USER_2)[0]
        if between.startswith(closed):
            user_opening = between[len(closed) :]
            if head.endswith(user_opening):
                block = head[: len(head) - len(user_opening)]
    except Exception:  # a template that refuses the probes writes no block we can find
        block = ""
    bos = getattr(tokenizer, "bos_token", None)
    if bos and block.startswith(bos) and not user_opening.startswith(bos):  # a BOS of its own, kept
        block = block[len(bos) :]  # (SmolLM2's "BOS" is <|im_start|>, which opens every turn)
    _DEFAULT_SYSTEM[tokenizer] = (template, block)
    return block


def without_default_system(tokenizer, text: str, messages: list[Message]) -> str:
    """`text`, the template's rendering of `messages`, less the template's default system prompt
    (`default_system_block`) when the messages hold no system message (`data.system_prompt none`);
    a BOS before it is kept."""
    if any(m["role"] == "system" for m in messages):
        return text
    block = default_system_block(tokenizer)
    if not block:
        return text
    bos = getattr(tokenizer, "bos_token", None) or ""
    if bos and not block.startswith(bos) and text.startswith(bos + block):
        return bos + text[len(bos) + len(block) :]
    return text[len(block) :] if text.startswith(block) else text
