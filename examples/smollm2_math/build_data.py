"""Rebuild data/ from the published SVAMP repository (github.com/arkilpatel/SVAMP, MIT).

    git clone https://github.com/arkilpatel/SVAMP && python examples/smollm2_math/build_data.py SVAMP

The published split of the SVAMP paper (its data/mawps-asdiv-a_svamp): train on MAWPS + ASDiv-A
(3,138 problems), test on SVAMP (1,000). Test problems come from SVAMP.json (the natural text, Body
and Question); training problems from the train.csv, whose numbers are written back in place of its
number0, number1, ... placeholders. One JSON line a problem: {"question", "answer", "equation"}, the
answer as a number's shortest text (51.0 -> "51").
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def number_text(value: float | str) -> str:
    """A number's shortest text: 51.0 -> "51", 0.50 -> "0.5"."""
    number = float(value)
    if number == int(number):
        return str(int(number))
    return repr(number)


def fill_numbers(masked: str, numbers: str) -> str:
    """`number0`, `number1`, ... replaced by the row's numbers (in their shortest text)."""
    values = [number_text(v) for v in numbers.split()]
    return re.sub(r"number(\d+)", lambda m: values[int(m[1])], masked)


def tidy(text: str) -> str:
    """The tokenized punctuation of the CSVs joined back ("books , how" -> "books, how")."""
    text = re.sub(r"\s+([.,?!;:])", r"\1", " ".join(text.split()))
    return text[0].upper() + text[1:] if text else text


def train_rows(csv_path: Path) -> list[dict]:
    with csv_path.open(newline="") as f:
        return [
            {
                "question": tidy(fill_numbers(row["Question"], row["Numbers"])),
                "answer": number_text(row["Answer"]),
                "equation": fill_numbers(row["Equation"], row["Numbers"]),
            }
            for row in csv.DictReader(f)
        ]


def test_rows(json_path: Path) -> list[dict]:
    rows = json.loads(json_path.read_text())
    return [
        {
            "question": tidy(f"{r['Body'].strip().rstrip('.')}. {r['Question'].strip()}"),
            "answer": number_text(r["Answer"]),
            "equation": r["Equation"].strip(),
            "id": r["ID"],
        }
        for r in rows
    ]


def write(rows: list[dict], path: Path) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{path}: {len(rows)} problems")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("svamp", type=Path, help="a checkout of github.com/arkilpatel/SVAMP")
    parser.add_argument("--out", type=Path, default=HERE / "data")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write(train_rows(args.svamp / "data" / "mawps-asdiv-a_svamp" / "train.csv"), args.out / "train.jsonl.gz")
    write(test_rows(args.svamp / "SVAMP.json"), args.out / "test.jsonl.gz")


if __name__ == "__main__":
    main()
