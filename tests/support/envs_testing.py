"""Environments of the tests (tests/envs): well-behaved ones over the tiny word vocabulary of
tests.support.train_testing ("a" .. "t"), and broken ones whose failures must exit 2."""

from __future__ import annotations


class Echo:
    """Replies "k l m" after every turn; each turn's reward is its word count; done after 3 turns."""

    def __init__(self, row: dict):
        self.turns = 0

    def step(self, response: str) -> tuple[str | None, float, bool]:
        self.turns += 1
        return "k l m", float(len(response.split())), self.turns >= 3


class NoStep:
    def __init__(self, row: dict):
        pass


class TwoArguments:
    def __init__(self, row: dict, other: int):
        pass

    def step(self, response: str):
        return None, 0.0, True


class NeedsAnswer:
    def __init__(self, row: dict):
        self.answer = row["answer"]

    def step(self, response: str):
        return None, 0.0, True


class Raises:
    def __init__(self, row: dict):
        pass

    def step(self, response: str):
        raise RuntimeError("the tool crashed")


class Returns:
    """step() returns the class attribute `result` (tests set it)."""

    result: object = None

    def __init__(self, row: dict):
        pass

    def step(self, response: str):
        return type(self).result


def not_a_class(row):
    return None
