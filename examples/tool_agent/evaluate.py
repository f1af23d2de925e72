"""The tool agent's demo, step 3: each policy served as an OpenAI-compatible endpoint (the library's
agent server, rlhf/agents/server.py, at /v1: nothing recorded) and the same calculator agent run
against it over HTTP on the held-out questions, sampled as in training (temperature 1); accuracy
with its Wilson 95% interval, the share of episodes that called the tool, the gain of the last
policy over the first.

    python examples/tool_agent/evaluate.py runs/tool_agent/sft runs/tool_agent/grpo \\
        --prompts runs/tool_agent/heldout.jsonl

`rlhf eval --reward-fn` answers each prompt in one turn; the agent needs the tool's result between
its turns, so the evaluation runs the agent itself (calculator_agent.run, what `--base-url` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calculator_agent import run  # noqa: E402

from rlhf.agents import Batcher, ChatServer, Settings, model_backend  # noqa: E402
from rlhf.data.chat import stop_token_ids  # noqa: E402
from rlhf.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhf.models.sampling import SamplingConfig  # noqa: E402


@contextlib.contextmanager
def serving(policy: str, *, max_new_tokens: int, seed: int) -> Iterator[str]:
    """The policy behind an OpenAI-compatible server on 127.0.0.1; yields its base URL (…/v1). Its
    requests are decoded together on a thread of this process (the requests' temperature and top_p)."""
    tok, model = load_tokenizer(policy), load_causal_lm(policy)
    base = SamplingConfig(max_new_tokens=max_new_tokens)
    generator = torch.Generator().manual_seed(seed)
    backend = model_backend(model, tok.pad_token_id, stop_token_ids(tok), base=base, generator=generator)
    batcher = Batcher(backend, window_s=0.05, honours_sampling=True)
    server = ChatServer(tok, batcher, Settings(policy, max_new_tokens))
    stop = threading.Event()

    def decode() -> None:
        while not stop.is_set():
            batch = batcher.take(64, 0.05)
            if batch:
                batcher.run(batch)

    thread = threading.Thread(target=decode, name="decode", daemon=True)
    thread.start()
    try:
        yield server.url + "/v1"
    finally:
        stop.set()
        thread.join()
        batcher.fail_all("the evaluation is over")
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", help="policy directories (the first is the baseline)")
    parser.add_argument("--prompts", required=True, help="held-out question rows (prompt, answer)")
    parser.add_argument("--samples", type=int, default=4, help="episodes per held-out question")
    parser.add_argument(
        "--max-new-tokens", type=int, default=12, help="tokens per turn (as rollout.max_new_tokens)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="episodes at once")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    results = []
    for policy in args.policies:
        with serving(policy, max_new_tokens=args.max_new_tokens, seed=args.seed) as base_url:
            result = run(base_url, policy, rows, samples=args.samples, concurrency=args.concurrency,
                         temperature=1.0)  # fmt: skip
        results.append({"policy": policy, **result})
        low, high = result["accuracy_ci95"]
        print(f"{policy}: accuracy {result['accuracy']:.3f} [{low:.3f}, {high:.3f}] over {result['episodes']} "
              f"held-out episodes; tool calls in {result['tool_call_share']:.0%}")  # fmt: skip
    summary: dict = {"results": results}
    if len(results) > 1:
        summary["gain"] = results[-1]["accuracy"] - results[0]["accuracy"]
        apart = results[-1]["accuracy_ci95"][0] > results[0]["accuracy_ci95"][1]
        print(f"gain: {summary['gain']:+.3f} (intervals apart: {apart})")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
