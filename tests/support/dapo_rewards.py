"""A reward function of the DAPO tests (`tests.support.dapo_rewards:first_token_even`): 0 or 1, so
that some groups of responses score all alike and others not."""

from __future__ import annotations


def first_token_even(completion_ids, **kwargs):
    """1.0 when the response's first token id is even, else 0.0."""
    return [float(bool(ids) and ids[0] % 2 == 0) for ids in completion_ids]
