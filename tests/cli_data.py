"""The little SFT and preference files the CLI tests train on (imported as `cli_data`)."""

from __future__ import annotations


def sft_rows(words: list[str], n: int = 16) -> list[dict]:
    """Two-word prompts answered by a word and "t"."""
    k = len(words)
    return [
        {"prompt": f"{words[i % k]} {words[(i + 1) % k]}", "response": f"{words[(i + 2) % k]} t"}
        for i in range(n)
    ]


def pair_rows(words: list[str], n: int = 16) -> list[dict]:
    """Pairs whose chosen response starts with "t" (an easy preference to learn)."""
    k = len(words)
    return [
        {"prompt": f"{words[i % k]} {words[(i + 3) % k]}", "chosen": f"t {words[(i + 5) % k]}",
         "rejected": f"{words[(i + 7) % k]} {words[(i + 2) % k]}"}
        for i in range(n)
    ]  # fmt: skip
