"""A calculator-tool agent written against the OpenAI API (the `openai` client): it asks the model
an arithmetic question with a `calculator` tool, runs the tool calls the model makes, sends the
results back, and scores the final answer (1 if its last integer is the row's `answer`, else 0).

The same function is trained (`rlhf train --agent calculator_agent:solve`, the server over the
policy given as `base_url`) and run against any OpenAI-compatible server outside training:

    python examples/tool_agent/calculator_agent.py --base-url http://127.0.0.1:8000/v1 --model M \\
        --prompts runs/tool_agent/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openai import OpenAI

from rlhf.envs.calculator import evaluate, last_integer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "the integer value of an arithmetic expression (+ - * // %)",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 2  # the model's turns: a call and the answer (a second call is no answer)


def calculator(arguments: str) -> str:
    """The tool: the value of the call's `expression`, or "error"."""
    try:
        expression = json.loads(arguments).get("expression")
    except (json.JSONDecodeError, AttributeError):
        return "error"
    value = evaluate(expression) if isinstance(expression, str) else None
    return "error" if value is None else str(value)


def episode(row: dict, base_url: str, model: str, temperature: float | None = None) -> tuple[float, int]:
    """(the reward, the tool calls made) of one question."""
    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0)
    extra = {} if temperature is None else {"temperature": temperature}
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    calls = 0
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, **extra)
        message = reply.choices[0].message
        if not message.tool_calls:
            return float(last_integer(message.content or "") == int(row["answer"])), calls
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            calls += 1
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)}
            )
    return 0.0, calls


def solve(row: dict, base_url: str, model: str) -> float:
    """The agent as `rlhf train --agent` calls it: one episode, its reward."""
    return episode(row, base_url, model)[0]


def run(base_url: str, model: str, rows: list[dict], *, samples: int, concurrency: int,
        temperature: float | None) -> dict:  # fmt: skip
    """`samples` episodes per row, `concurrency` at once: accuracy with its Wilson 95% interval and
    the share of episodes that called the tool."""
    from rlhf.evaluation.judging import wilson_interval

    jobs = [row for row in rows for _ in range(samples)]
    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(lambda row: episode(row, base_url, model, temperature), jobs))
    right = int(sum(reward for reward, _ in outcomes))
    return {
        "episodes": len(jobs),
        "accuracy": right / len(jobs),
        "accuracy_ci95": list(wilson_interval(right, len(jobs))),
        "tool_call_share": sum(calls > 0 for _, calls in outcomes) / len(jobs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", required=True, help="the server's OpenAI API root, e.g. http://HOST:PORT/v1"
    )
    parser.add_argument("--model", required=True, help="the model name the server serves")
    parser.add_argument("--prompts", required=True, help="question rows {prompt, answer} (JSON lines)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per question")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes at once")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="the requests' temperature (the server's default: unset)",
    )
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    result = run(args.base_url, args.model, rows, samples=args.samples, concurrency=args.concurrency,
                 temperature=args.temperature)  # fmt: skip
    low, high = result["accuracy_ci95"]
    print(f"accuracy {result['accuracy']:.3f} [{low:.3f}, {high:.3f}] over {result['episodes']} episodes; "
          f"tool calls in {result['tool_call_share']:.0%}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
