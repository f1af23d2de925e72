"""The position-swapped pairwise win rate (rlhf/evaluation/pairwise_verdicts.py, docs/algorithms.md
§33) against a plain loop over every combination of two verdicts: a win needs both orders, a
contradiction or a tie counts half, an unparsable verdict drops its pair."""

from __future__ import annotations

import itertools

import pytest

from rlhf.evaluation.judging import wilson_interval
from rlhf.evaluation.pairwise_verdicts import pair_outcome, swapped_win_rate

VERDICTS = ("A", "B", "tie", None)


def plain_outcome(first, swapped):
    """The policy is A in `first`, B in `swapped`: its score in each order, then the rule."""
    if first is None or swapped is None:
        return None
    score = {"A": 1.0, "B": 0.0, "tie": 0.5}[first], {"A": 0.0, "B": 1.0, "tie": 0.5}[swapped]
    if score == (1.0, 1.0):
        return "policy"
    if score == (0.0, 0.0):
        return "baseline"
    return "tie"


def test_each_pair_of_verdicts_against_the_plain_rule():
    for first, swapped in itertools.product(VERDICTS, VERDICTS):
        assert pair_outcome(first, swapped) == plain_outcome(first, swapped), (first, swapped)


def test_the_win_rate_of_every_combination_with_its_interval():
    pairs = list(itertools.product(VERDICTS, VERDICTS))
    first, swapped = [a for a, _ in pairs], [b for _, b in pairs]
    result = swapped_win_rate(first, swapped)
    outcomes = [plain_outcome(a, b) for a, b in pairs]
    n = sum(o is not None for o in outcomes)  # 9 of 16: either unparsable drops the pair
    wins, losses = outcomes.count("policy"), outcomes.count("baseline")
    ties = n - wins - losses
    assert (
        (result["n"], result["wins"], result["losses"], result["ties"])
        == (9, 1, 1, 7)
        == (n, wins, losses, ties)
    )
    assert result["dropped"] == 7 and result["inconsistent"] == 2  # (A, A) and (B, B): position followed
    assert result["win_rate"] == pytest.approx((wins + ties / 2) / n) == 0.5
    assert result["win_rate_ci95"] == wilson_interval(wins + ties / 2, n)
    decisive = [v for v in (*first, *swapped) if v in ("A", "B")]
    assert result["prefers_first"] == decisive.count("A") / len(decisive)


def test_one_pair_and_none_parsed():
    assert swapped_win_rate(["A"], ["B"])["win_rate"] == 1.0
    assert swapped_win_rate(["B"], ["A"])["win_rate"] == 0.0
    empty = swapped_win_rate([None, "A"], ["A", None])
    assert empty["n"] == 0 and empty["win_rate"] is None and empty["dropped"] == 2
    assert empty["win_rate_ci95"] == [0.0, 1.0]
    with pytest.raises(ValueError, match="2 verdicts in the first order, 1 swapped"):
        swapped_win_rate(["A", "B"], ["A"])
