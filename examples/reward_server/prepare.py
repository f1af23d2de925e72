"""The reward-server demo, step 1: a tiny base model and the three data files, nothing downloaded.

    python examples/reward_server/prepare.py --out runs/reward_server/data

Writes under --out:
- `base/`: a word tokenizer and a randomly initialized tiny Llama (hidden 32, one layer), one
  Hugging Face directory that `rlhf sft --model` reads;
- `sft.jsonl`: two-word prompts answered by a word and "yes";
- `pairs.jsonl`: preference pairs whose chosen response starts with "yes" (an easy preference for
  the reward model to learn);
- `prompts.jsonl`: the prompts the RL runs sample from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

NOUNS = "red green blue cat dog fox sun moon tree rock river cloud bird fish star leaf".split()
WORDS = [*NOUNS, "yes", "no"]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="a new or empty directory")
    parser.add_argument("--rows", type=int, default=32, help="rows of each data file")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tok = word_tokenizer([" ".join(WORDS)])
    tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(out / "base")
    tok.save_pretrained(out / "base")

    k, n = len(NOUNS), args.rows
    word = lambda i: NOUNS[i % k]  # noqa: E731
    sft = [{"prompt": f"{word(i)} {word(i + 1)}", "response": f"{word(i + 2)} yes"} for i in range(n)]
    pairs = [
        {
            "prompt": f"{word(i)} {word(i + 3)}",
            "chosen": f"yes {word(i + 5)}",
            "rejected": f"{word(i + 7)} no",
        }
        for i in range(n)
    ]
    write_jsonl(out / "sft.jsonl", sft)
    write_jsonl(out / "pairs.jsonl", pairs)
    write_jsonl(out / "prompts.jsonl", [{"prompt": row["prompt"]} for row in pairs])
    print(f"wrote {out}/base, sft.jsonl, pairs.jsonl, prompts.jsonl ({n} rows each)")


if __name__ == "__main__":
    main()
