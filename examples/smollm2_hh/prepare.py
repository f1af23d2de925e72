"""Split HH-RLHF preference pairs into the files of the SmolLM2 + HH recipe (run.sh), with a fixed seed.

    python examples/smollm2_hh/prepare.py --data hh.jsonl.gz --out runs/smollm2_hh/data

Rows are grouped by their prompt (the dialogue before the last Assistant turn) so that no prompt of
the held-out pairs or of the evaluation prompts is seen in training:

    rm_heldout.jsonl   held-out pairs: `rlhf rm-eval` (accuracy with its Wilson interval)
    eval_prompts.jsonl held-out prompts: `rlhf eval` (win rate of PPO against SFT)
    sft.jsonl          SFT examples (HH rows: `rlhf sft` trains on the chosen response)
    rm_train.jsonl     training pairs of the reward model PPO optimizes, and of DPO
    rm2_train.jsonl    training pairs of judge 2, the second reward model: disjoint from rm_train
                       (no prompt shared with it, nor with SFT, PPO or the held-out files)
    ppo_prompts.jsonl  PPO prompts (HH rows: `rlhf train` takes the prompt)
    judge_pool.jsonl   every training pair (rm_train and rm2_train) in the split's random prompt-group
                       order: its first N rows are the N pairs of a judge of judge_curve.py

The training prompt groups go to rm_train and rm2_train in turn (to the one with fewer rows), so the
two judges are trained on about as many pairs; SFT and PPO take rm_train's.

The files keep the HH format ({"chosen", "rejected"} dialogues): every stage reads it. split.json
records the counts and the seed. Rows that are no pair are dropped: an empty last Assistant turn, or
two dialogues that differ before it (HH holds both kinds; so the held-out file's pairs are all valid).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

ASSISTANT = "\n\nAssistant:"
DEFAULT_DATA = Path(__file__).parent / "data" / "harmless-base-test-first1500.jsonl.gz"


def read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def prompt_of(row: dict) -> str:
    """The shared dialogue up to the last Assistant turn (HH's prompt)."""
    return row["chosen"][: row["chosen"].rfind(ASSISTANT)]


def has_both_responses(row: dict) -> bool:
    """HH holds a few rows whose last Assistant turn is empty: they are no pair (and no SFT target)."""
    return all(
        row[side][row[side].rfind(ASSISTANT) + len(ASSISTANT) :].strip() for side in ("chosen", "rejected")
    )


def shares_its_prompt(row: dict) -> bool:
    """Both dialogues are the same up to their last Assistant turn (`rlhf rm-eval` skips a row that
    is not: its two responses answer different conversations)."""
    rejected = row["rejected"]
    return prompt_of(row) == rejected[: rejected.rfind(ASSISTANT)]


def is_pair(row: dict) -> bool:
    return has_both_responses(row) and shares_its_prompt(row)


def split(rows: list[dict], seed: int, heldout: int, eval_prompts: int, sft: int) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in filter(is_pair, rows):
        groups.setdefault(prompt_of(row), []).append(row)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    files: dict[str, list[dict]] = {"rm_heldout": [], "eval_prompts": [], "train": [], "rm2_train": []}
    pool: list[dict] = []  # the training groups in the order they were drawn
    for key in keys:  # whole prompt groups, so no prompt crosses from held-out to training
        target = (
            "rm_heldout"
            if len(files["rm_heldout"]) < heldout
            else "eval_prompts"
            if len(files["eval_prompts"]) < eval_prompts
            else min(("train", "rm2_train"), key=lambda name: len(files[name]))
        )
        files[target].extend(groups[key][:1] if target == "eval_prompts" else groups[key])
        if target in ("train", "rm2_train"):
            pool.extend(groups[key])
    train = files.pop("train")
    return {
        **files,
        "sft": train[:sft],
        "rm_train": train,
        "ppo_prompts": train,
        "judge_pool": pool,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT_DATA, help="HH-RLHF .jsonl or .jsonl.gz")
    parser.add_argument("--out", required=True, help="directory of the split files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=300, help="held-out reward-model pairs")
    parser.add_argument("--eval-prompts", type=int, default=100, help="held-out prompts for rlhf eval")
    parser.add_argument("--sft", type=int, default=400, help="SFT examples (chosen responses)")
    args = parser.parse_args()
    rows = read_rows(Path(args.data))
    files = split(rows, args.seed, args.heldout, args.eval_prompts, args.sft)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, records in files.items():
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    held = {prompt_of(r) for name in ("rm_heldout", "eval_prompts") for r in files[name]}
    trained = {prompt_of(r) for r in files["rm_train"]}
    judge2 = {prompt_of(r) for r in files["rm2_train"]}
    assert not held & (trained | judge2), "a held-out prompt is in training"
    assert not trained & judge2, "a prompt of judge 2's pairs is in the first reward model's"
    counts = {name: len(records) for name, records in files.items()}
    empty = len(rows) - sum(map(has_both_responses, rows))
    summary = {
        "data": str(args.data),
        "rows": len(rows),
        "empty_responses_dropped": empty,
        "differing_prompts_dropped": len(rows) - empty - sum(map(is_pair, rows)),
        "seed": args.seed,
    }
    summary["files"] = counts
    (out / "split.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
