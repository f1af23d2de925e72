"""Reward functions of the tests, named as `tests.support.reward_fns_testing:NAME` (the repository root
is on sys.path: pytest puts it there for the `tests` package)."""

from __future__ import annotations

import math

CALLS: list[dict] = []  # what each call saw


def length(prompts, responses, response_token_ids, rows):
    """The number of response tokens (EOS included)."""
    CALLS.append({"prompts": prompts, "responses": responses, "ids": response_token_ids, "rows": rows})
    return [float(len(ids)) for ids in response_token_ids]


def constant(prompts, responses, response_token_ids, rows):
    return [0.25] * len(prompts)


def bonus(prompts, responses, response_token_ids, rows):
    """The `bonus` field of the prompt's line in the prompts file."""
    return [float(row["bonus"]) for row in rows]


def raises(prompts, responses, response_token_ids, rows):
    raise KeyError("no such answer")


def too_short(prompts, responses, response_token_ids, rows):
    return [1.0] * (len(prompts) - 1)


def nan_at_row_two(prompts, responses, response_token_ids, rows):
    return [math.nan if i == 2 else 0.0 for i in range(len(prompts))]


def text(prompts, responses, response_token_ids, rows):
    return "not numbers"


NOT_A_FUNCTION = 3
