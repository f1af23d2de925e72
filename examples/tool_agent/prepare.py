"""The tool agent's demo, step 1: a word tokenizer with a chat template that reads `tools`, a tiny
Llama warm-started on chat transcripts of the calculator agent, and the prompt files.

    python examples/tool_agent/prepare.py --out runs/tool_agent

The questions, their split and the warm start are examples/calculator_env/prepare.py's; only the
transcripts differ: here they are the chat template's rendering of the agent's conversation (the
`calculator` tool of calculator_agent.py), so the policy learns the format the server renders.
In a quarter of them the assistant calls the tool (an OpenAI tool call the template writes as
`<tool_call> {"name": "calculator", "arguments": {"expression": "7 * 18"}} </tool_call>`), reads the
tool's turn and answers; in the others it guesses a number near the product. The tool's turn and
the template's text are context (loss 0), as in RL.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # calculator_agent.py, and calculator_env as a package

from calculator_agent import TOOLS, calculator  # noqa: E402
from calculator_env.prepare import arguments, prepare  # noqa: E402

from rlhf.models.tiny import word_tokenizer  # noqa: E402

# a Qwen2.5-like template (tools named in a system turn, calls in <tool_call> blocks, tool turns),
# written with spaces between words so that the word tokenizer splits it
TEMPLATE = (
    "{%- if tools %}<|im_start|> system tools: {% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|> assistant {{ m.content }}"
    "{%- for c in m.tool_calls or [] %} <tool_call> {{ c.function | tojson }} </tool_call>{% endfor %} <|im_end|>\n"
    "{%- else %}<|im_start|> {{ m.role }} {{ m.content }} <|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>"]


def conversation(row: dict, call: bool, guess: int) -> list[tuple[dict, bool]]:
    """The agent's messages for `row`, each with whether the policy wrote it."""
    a, _, b = row["prompt"].split()[:3]
    messages = [({"role": "user", "content": row["prompt"]}, False)]
    if not call:
        return messages + [({"role": "assistant", "content": str(guess)}, True)]
    arguments = {"expression": f"{a} * {b}"}
    tool_call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
    result = calculator(json.dumps(arguments))
    return messages + [
        ({"role": "assistant", "content": "", "tool_calls": [tool_call]}, True),
        ({"role": "tool", "content": result}, False),
        ({"role": "assistant", "content": result}, True),
    ]


def rendered_pieces(tok, parts: list[tuple[dict, bool]]) -> list[tuple[str, int]]:
    """The template's text of the conversation, cut where each message's own text begins: the text
    up to an assistant message's opening is context (0), from there to its end the policy's (1)."""
    pieces, done, messages = [], "", []
    for message, trained in parts:
        if trained:  # the generation prompt is context, the assistant's text and closing the policy's
            cue = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
            pieces.append((cue[len(done) :], 0))
            done = cue
        messages.append(message)
        text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
        pieces.append((text[len(done) :], int(trained)))
        done = text
    return pieces


def chat_transcript(tok, row: dict, rng: random.Random, tool_share: float) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one rendered conversation (calculator_env's `transcript`, in chat form)."""
    call, guess = rng.random() < tool_share, row["answer"] + rng.randint(-12, 12)
    return encoded(tok, row["prompt"], row["answer"], call, 0 if call else guess)


@functools.cache
def encoded(tok, prompt: str, answer: int, call: bool, guess: int) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for text, trained in rendered_pieces(
        tok, conversation({"prompt": prompt, "answer": answer}, call, guess)
    ):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def chat_tokenizer(rows: list[dict]):
    """A word tokenizer over every word the template writes for these questions (both forms, every
    guess), the template's markers as special tokens, and the template itself."""
    words = {str(n) for n in range(-20, 300)} | {"error"}
    probe = word_tokenizer(["x"])
    probe.add_special_tokens({"additional_special_tokens": SPECIAL})
    probe.chat_template = TEMPLATE
    for row in rows:
        for text, _ in rendered_pieces(probe, conversation(row, True, 0)):
            words.update(w for w in text.split() if w not in SPECIAL)
    tok = word_tokenizer([" ".join(sorted(words))])
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = TEMPLATE
    return tok


def main() -> None:
    prepare(arguments("runs/tool_agent", 400), chat_tokenizer, make=chat_transcript)


if __name__ == "__main__":
    main()
