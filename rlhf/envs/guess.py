"""A guessing game: the policy guesses a hidden number; the environment replies `higher` or
`lower` until the guess is right (reward 1, done). A turn without a number gets `say a number`.

Prompt rows: {"prompt": "guess 1 to 16 :", "target": 11} (`guess_rows` writes such rows).
"""

from __future__ import annotations

import random

from rlhf.envs.calculator import last_integer


class GuessNumber:
    """One hidden number; every wrong guess is answered `higher` or `lower`."""

    def __init__(self, row: dict):
        self.target = int(row["target"])
        self.guesses = 0

    def step(self, response: str) -> tuple[str | None, float, bool]:
        guess = last_integer(response)
        if guess is None:
            return "say a number", 0.0, False
        self.guesses += 1
        if guess == self.target:
            return None, 1.0, True
        return ("higher" if guess < self.target else "lower"), 0.0, False


def guess_rows(count: int, seed: int, high: int = 16) -> list[dict]:
    """`count` games with a hidden number in [1, high]."""
    rng = random.Random(seed)
    return [{"prompt": f"guess 1 to {high} :", "target": rng.randint(1, high)} for _ in range(count)]
