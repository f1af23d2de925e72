"""The calculator environment's demo, step 3: held-out episodes of each policy, sampled as in
training (temperature 1, two turns), scored by the environment; accuracy with its Wilson 95%
interval, the share of episodes that called the tool, and the gain of the last policy over the first.

    python examples/calculator_env/evaluate.py runs/calc/sft runs/calc/grpo --prompts runs/calc/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rlhf.data.collate import left_pad
from rlhf.envs import load_environment, run_episodes
from rlhf.evaluation.judging import wilson_interval
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.sampling import SamplingConfig, generate

ENV = "rlhf.envs.calculator:Calculator"


def evaluate(
    policy: str, rows: list[dict], *, seed: int, samples: int, max_new_tokens: int, max_turns: int
) -> dict:
    tok, model = load_tokenizer(policy), load_causal_lm(policy)
    environment = load_environment(ENV)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    generator = torch.Generator().manual_seed(seed)

    def sample(contexts: list[list[int]]):
        ids, mask = left_pad(contexts, tok.pad_token_id)
        return generate(model, ids, mask, sampling, tok.eos_token_id, tok.pad_token_id, generator)

    episodes = [(row, k) for row in rows for k in range(samples)]
    envs = [environment.episode(row, i) for i, (row, _) in enumerate(episodes)]
    prompts = [tok(row["prompt"], add_special_tokens=False)["input_ids"] for row, _ in episodes]
    out = run_episodes(sample, tok, prompts, envs, environment, max_turns=max_turns,
                       max_tokens=max_turns * max_new_tokens)  # fmt: skip
    right = int(out.rewards.sum())
    return {
        "policy": policy,
        "episodes": len(episodes),
        "accuracy": right / len(episodes),
        "accuracy_ci95": wilson_interval(right, len(episodes)),
        "tool_call_share": sum(e.calls > 0 for e in envs) / len(envs),
        "turns_mean": float(out.turns.float().mean()),
        "example": out.transcripts[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", help="policy directories (the first is the baseline)")
    parser.add_argument("--prompts", required=True, help="held-out prompt rows (prompt, answer)")
    parser.add_argument("--samples", type=int, default=4, help="episodes per held-out question")
    parser.add_argument(
        "--max-new-tokens", type=int, default=8, help="tokens per turn (as rollout.max_new_tokens)"
    )
    parser.add_argument(
        "--max-turns", type=int, default=2, help="policy turns per episode (as env.max_turns)"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    results = [
        evaluate(p, rows, seed=args.seed, samples=args.samples, max_new_tokens=args.max_new_tokens,
                 max_turns=args.max_turns)
        for p in args.policies
    ]  # fmt: skip
    for r in results:
        low, high = r["accuracy_ci95"]
        print(f"{r['policy']}: accuracy {r['accuracy']:.3f} [{low:.3f}, {high:.3f}] over {r['episodes']} held-out "
              f"episodes; tool calls in {r['tool_call_share']:.0%}; e.g. {r['example']!r}")  # fmt: skip
    summary = {"results": results}
    if len(results) > 1:
        summary["gain"] = results[-1]["accuracy"] - results[0]["accuracy"]
        print(
            f"gain: {summary['gain']:+.3f} (intervals above do not overlap: {results[-1]['accuracy_ci95'][0] > results[0]['accuracy_ci95'][1]})"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
