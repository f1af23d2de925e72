"""What a prompt budget leaves of the recipe's held-out prompts: for each budget and system-prompt
setting, the share of prompts that lose anything (turns, text or tokens), that lose earlier turns,
and whose last human turn itself is cut; as `rlhf` encodes them (rlhf.data.tokenize.encode_prompt).

    python examples/smollm2_hh/prompt_budget.py --model DIR_OR_HUB_ID --data runs/smollm2_hh/data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats, encode_prompt
from rlhf.models.loading import load_tokenizer, prepare_tokenizer


def measure(tokenizer, prompts: list, budgets: list[int]) -> dict:
    rows = {}
    for system_prompt in ("template", "none"):
        lengths = sorted(len(encode_prompt(tokenizer, p, None, system_prompt=system_prompt)) for p in prompts)
        for budget in budgets:
            stats = TruncationStats()
            for prompt in prompts:
                encode_prompt(tokenizer, prompt, budget, stats, system_prompt=system_prompt)
            rows[f"{system_prompt} {budget}"] = {
                "prompts": stats.prompts,
                "truncated": stats.prompts_truncated_share,
                "turns_dropped": stats.prompts_turns_dropped / stats.prompts,
                "last_turn_cut": stats.prompts_left_truncated / stats.prompts,
                "median_tokens_untruncated": lengths[len(lengths) // 2],
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="SmolLM2 directory or hub id (its tokenizer)")
    parser.add_argument("--gguf-file", help="a GGUF file inside --model")
    parser.add_argument("--data", required=True, help="the directory prepare.py wrote")
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 96, 128, 192])
    args = parser.parse_args()
    options = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    tokenizer = prepare_tokenizer(load_tokenizer(args.model, **options))
    result = {}
    for name in ("eval_prompts", "rm_heldout"):
        loaded = load_examples(Path(args.data) / f"{name}.jsonl", kind="prompt", skip_invalid=True)
        result[name] = measure(tokenizer, [ex.prompt for ex in loaded.examples], args.budgets)
        print(f"{name} ({len(loaded.examples)} prompts): truncated / earlier turns dropped / last turn cut")
        for key, row in result[name].items():
            print(
                f"  {key:>14}: {row['truncated']:.2f} / {row['turns_dropped']:.2f} / {row['last_turn_cut']:.2f}"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
