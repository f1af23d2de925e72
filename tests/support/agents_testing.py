"""The agents of the tests (tests/agents): a word tokenizer with a tool-reading chat template, a
scripted Llama that always writes one tool call, and agent functions over the real `openai` client,
well-behaved ones and broken ones whose failures the runner must count."""

from __future__ import annotations

import asyncio
import time

import torch

from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

# a Qwen2.5-like template: tools in the system turn, calls as <tool_call> blocks, tool turns
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }} "
    "{% endif %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}{% if m.role == 'system' %}{% if not loop.first %}<|im_start|>system\n"
    "{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %} <tool_call> {{ c.function | tojson }} </tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the scripted policy's one answer: the call add(2, 3), word by word, then the end of its turn
CALL = ["<tool_call>", '{"name":', '"add",', '"arguments":', '{"a":', "2,", '"b":', "3}}", "</tool_call>"]
WORDS = "system user assistant tool tools: add the sum is 5 what 2 plus 3 ? edited a b c d e f g h"


def chat_tokenizer():
    tokenizer = word_tokenizer([WORDS + " " + " ".join(CALL)])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def stop_ids(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def scripted_llama(tokenizer, chain: list[str], strength: float = 0.5) -> torch.nn.Module:
    """A Llama whose next token depends on the last one alone: every attention and MLP output is
    zero, so the stream at a token is its (one-hot) embedding, and the head favours `chain[k+1]`
    after `chain[k]` (greedy follows the chain; its log-probs are well below 0)."""
    vocab = len(tokenizer)
    model = tiny_causal_lm(tokenizer, seed=0, hidden_size=64, num_layers=1, num_heads=2)
    assert vocab <= 64
    ids = [tokenizer.convert_tokens_to_ids(t) for t in chain]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, 64))
        head = model.lm_head.weight
        head.zero_()
        for a, b in zip(ids, ids[1:]):
            head[b, a] = strength  # x 8 (the norm of a one-hot over 64): a logit of 8 * strength
    return model


def call_chain(tokenizer) -> list[str]:
    """The generation prompt's last token, the call, the end of the turn."""
    return ["assistant", *CALL, "<|im_end|>"]


def add(a: int, b: int) -> int:
    return a + b


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


def openai_client(base_url: str):
    """The real `openai` client; its transport without the TLS set-up (a quarter second per client,
    for a loopback http:// address that needs none)."""
    from openai import DefaultHttpxClient, OpenAI

    return OpenAI(
        base_url=base_url, api_key="none", max_retries=0, http_client=DefaultHttpxClient(verify=False)
    )


def tool_agent(row: dict, base_url: str, model: str) -> float:
    """Two turns with the real openai client: the policy calls `add`, the tool's result goes back,
    the policy answers again; the reward is 1 when the first call was add(2, 3)."""
    import json

    client = openai_client(base_url)
    messages: list = [
        {"role": "system", "content": "the sum"},
        {"role": "user", "content": "what is 2 plus 3 ?"},
    ]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, temperature=0, logprobs=True
    )
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(add(**arguments))})
    client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0)
    return float(call.function.name == "add" and arguments == {"a": 2, "b": 3})


def chat_agent(row: dict, base_url: str, model: str) -> list[float]:
    """Two plain turns (a user's follow-up between them), per-turn rewards: each turn's word count."""
    client = openai_client(base_url)
    messages: list = [{"role": "user", "content": row.get("prompt", "a b c")}]
    rewards = []
    for follow_up in ("k l m", None):
        reply = client.chat.completions.create(model=model, messages=messages).choices[0].message
        rewards.append(float(len((reply.content or "").split())))
        messages.append({"role": "assistant", "content": reply.content})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return rewards


async def async_chat_agent(row: dict, base_url: str, model: str) -> float:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0,
                         http_client=DefaultAsyncHttpxClient(verify=False))  # fmt: skip
    reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a b"}])
    return float(len(reply.choices[0].message.content or ""))


def editing_agent(row: dict, base_url: str, model: str) -> float:
    """The second request rewrites the first answer: the record cannot explain it (a new segment)."""
    client = openai_client(base_url)
    messages: list = [{"role": "user", "content": "a b"}]
    reply = client.chat.completions.create(model=model, messages=messages).choices[0].message
    messages += [
        {"role": "assistant", "content": (reply.content or "") + " edited"},
        {"role": "user", "content": "c"},
    ]
    client.chat.completions.create(model=model, messages=messages)
    return 1.0


def raising_agent(row: dict, base_url: str, model: str) -> float:
    raise RuntimeError("the tool crashed")


def hanging_agent(row: dict, base_url: str, model: str) -> float:
    time.sleep(3)  # past the tests' agent.timeout_s
    return 1.0


async def hanging_async_agent(row: dict, base_url: str, model: str) -> float:
    await asyncio.sleep(3)
    return 1.0


def wordy_agent(row: dict, base_url: str, model: str) -> str:
    """Answers a text, not a number."""
    openai_client(base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "a"}])
    return "great"


def huge_agent(row: dict, base_url: str, model: str) -> float:
    """Answers a reward finite in float64 and not in float32 (the dtype rewards are computed in)."""
    openai_client(base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "a"}])
    return 1e39


def huge_integer_agent(row: dict, base_url: str, model: str) -> int:
    """Answers a reward beyond even float64."""
    openai_client(base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "a"}])
    return 10**400


def row_agent(row: dict, base_url: str, model: str) -> float:
    """Fails on the rows whose `fail` field is set, else one request and reward 1."""
    if row.get("fail"):
        raise ValueError(f"row {row['id']} is bad")
    openai_client(base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "a"}])
    return 1.0


def not_called_with_three(row: dict) -> float:
    return 0.0
