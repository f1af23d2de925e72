"""Reward functions of the tests, named as `tests.support.reward_fns_testing:NAME` (the repository root
is on sys.path: pytest puts it there for the `tests` package)."""

from __future__ import annotations

import math

CALLS: list[dict] = []  # what each call saw


def length(prompts, responses, response_token_ids, rows):
    """The number of response tokens (EOS included)."""
    CALLS.append({"prompts": prompts, "responses": responses, "ids": response_token_ids, "rows": rows})
    return [float(len(ids)) for ids in response_token_ids]


def letters(prompts, responses, response_token_ids, rows):
    """A score that varies with the response: its letters among a to e (the tests' words are letters)."""
    return [float(sum(ch in "abcde" for ch in response)) for response in responses]


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


# TRL's form: called by keyword, with the arguments each names


def trl_exact(completions, answer, **kwargs):
    """1 when the response is the prompt line's `answer` field; records what else came by keyword."""
    CALLS.append({"kwargs": sorted(kwargs), "answer": answer})
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def aliases(prompts, responses, response_token_ids, level=7):
    """The older names as keywords, a field with a default (the count of ids plus the level)."""
    return [float(len(ids) + lv) for ids, lv in zip(response_token_ids, [level] * len(prompts))]


def positional_only(prompts, completions, /):
    return [0.0] * len(prompts)


def other_names(p, r, ids, records):
    """Four arguments under names that are neither standard nor fields (refused: no positional call)."""
    return [float(len(x)) + float(len(records)) * 0 for x in ids]


def overflows_float32(prompts, responses, response_token_ids, rows):
    return [1e300] * len(prompts)


# `rlhf eval --reward-fn` alone (accuracy on a verifiable task): a 0/1 verifier reading a row field


def says_answer(completions, answer, **kwargs):
    """1 when the prompt line's `answer` word is among the response's words, else 0 (a verifier)."""
    return [float(a in c.split()) for c, a in zip(completions, answer)]
