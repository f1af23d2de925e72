"""The recipe's files from data/ (examples/smollm2_math/README.md):

    OUT/sft.jsonl            training problems as SFT examples: the question, and as the response its
                             equation as arithmetic ("56 * 9"; `--format equation`: "56 * 9 = 504")
    OUT/train_prompts.jsonl  training problems as RL prompts, with their `answer` (the verifier's field)
    OUT/test_prompts.jsonl   the test problems (SVAMP), the same way

    python examples/smollm2_math/prepare.py --out runs/smollm2_math/data

Every prompt is one HH-style user turn ("\\n\\nHuman: QUESTION\\n\\nAssistant:"), which `rlhf`
renders with SmolLM2-Instruct's chat template.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPERATORS = {"+", "-", "*", "/"}


def prompt_text(question: str) -> str:
    """The prompt of one problem, an HH-style user turn."""
    return f"\n\nHuman: {question}\n\nAssistant:"


def _number(text: str) -> str:
    value = Fraction(text)
    return str(value.numerator) if value.denominator == 1 else text


def infix(prefix: str) -> tuple[str, Fraction]:
    """A prefix equation ("* 56 9", MAWPS/ASDiv-A's) as infix text and its exact value:
    ("56 * 9", 504). Inner operations get parentheses ("- 10 + 2 3" -> "10 - (2 + 3)")."""
    tokens = prefix.split()

    def parse(i: int) -> tuple[str, Fraction, int, bool]:
        token = tokens[i]
        if token not in OPERATORS:
            return _number(token), Fraction(token), i + 1, False
        left, a, i, left_op = parse(i + 1)
        right, b, i, right_op = parse(i)
        left = f"({left})" if left_op else left
        right = f"({right})" if right_op else right
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else Fraction(0)}[token]
        return f"{left} {token} {right}", value, i, True

    text, value, end, _ = parse(0)
    if end != len(tokens):
        raise ValueError(f"not one prefix expression: {prefix!r}")
    return text, value


def number_text(value: Fraction) -> str:
    """An exact value as the shortest decimal text (2 decimals at most): 504, 2.5, 0.33."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


def sft_response(row: dict, answer_format: str = "expression") -> str | None:
    """A training row's response: its equation as arithmetic ("56 * 9", the format `expression`) or
    written out with its result ("56 * 9 = 504", `equation`); None when the equation does not give
    the row's answer."""
    try:
        text, value = infix(row["equation"])
    except (ValueError, ZeroDivisionError, IndexError):
        return None
    answer = number_text(value)
    if answer != row["answer"]:
        return None
    return text if answer_format == "expression" else f"{text} = {answer}"


def read(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{path}: {len(rows)} rows")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=HERE / "data", help="train.jsonl.gz and test.jsonl.gz")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0, help="order of the SFT examples")
    parser.add_argument(
        "--format",
        choices=["expression", "equation"],
        default="expression",
        help="the SFT answer: the arithmetic alone (56 * 9) or with its result (56 * 9 = 504)",
    )
    args = parser.parse_args(argv)
    train, test = read(args.data / "train.jsonl.gz"), read(args.data / "test.jsonl.gz")
    sft = [
        {"prompt": prompt_text(r["question"]), "response": response}
        for r in train
        if (response := sft_response(r, args.format)) is not None
    ]
    random.Random(args.seed).shuffle(sft)
    args.out.mkdir(parents=True, exist_ok=True)
    write(sft, args.out / "sft.jsonl")
    write(
        [{"prompt": prompt_text(r["question"]), "answer": r["answer"]} for r in train],
        args.out / "train_prompts.jsonl",
    )
    write(
        [{"prompt": prompt_text(r["question"]), "answer": r["answer"]} for r in test],
        args.out / "test_prompts.jsonl",
    )
    print(json.dumps({"train": len(train), "sft": len(sft), "test": len(test)}))


if __name__ == "__main__":
    main()
