"""The little SFT and preference files the CLI tests train on (tests.support.cli_data)."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """`rows` as a JSON-lines file at `path`; returns the path as the string a CLI flag takes."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


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


def save_tiny_base(directory, words: list[str]):
    """A tiny Llama (hidden 32, one layer) and its word tokenizer saved as one Hugging Face
    directory, the base model of the CLI tests; returns the tokenizer."""
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

    tok = word_tokenizer([" ".join(words)])
    tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(directory)
    tok.save_pretrained(directory)
    return tok
