"""The length-controlled win rate and the other length-bias figures (rlhf/evaluation/length_control.py)
against closed forms: a logistic fit whose answer is known (two length values: the fit is saturated),
a judge driven by length alone, no length effect, all ties, one pair, none; the length-matched win
rate, the "shorter wins" baseline and the correlations counted by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf.evaluation.judging import wilson_interval
from rlhf.evaluation.length_control import (
    fit_logistic,
    length_bias_warning,
    length_controlled_win_rate,
    length_matched_win_rate,
    margin_length_correlation,
    outcomes,
    shorter_wins_baseline,
    word_count,
)


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def two_lengths(wins_short: int, n_short: int, wins_long: int, n_long: int, d: float = 6.0):
    """Pairs whose policy answer is `d` words shorter (first group) or longer (second) than the
    baseline's, with the given numbers of wins."""
    y = [1.0] * wins_short + [0.0] * (n_short - wins_short) + [1.0] * wins_long + [0.0] * (n_long - wins_long)
    return y, [-d] * n_short + [d] * n_long


def test_a_fit_with_two_length_values_reproduces_both_observed_rates():
    # saturated: sigmoid(a -+ b x) are the observed win rates 3/10 and 8/10, so at x = 0 the
    # length-controlled win rate is sigmoid of the mean of their logits
    y, d = two_lengths(3, 10, 8, 10)
    result = length_controlled_win_rate(y, d)
    expected = sigmoid((logit(0.3) + logit(0.8)) / 2)
    assert result["win_rate"] == pytest.approx(expected, abs=1e-5)  # the ridge moves it by ~2e-6
    assert result["raw_win_rate"] == pytest.approx(0.55)
    x = math.tanh(1.0)  # d / sd(d) = 1: the feature of the longer group
    assert result["length_coef"] == pytest.approx((logit(0.8) - logit(0.3)) / (2 * x), rel=1e-4)
    low, high = result["win_rate_ci95"]
    assert low < result["win_rate"] < high


def test_fit_logistic_solves_the_score_equations_with_fractional_outcomes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=200)
    y = np.where(rng.random(200) < 0.1, 0.5, (rng.random(200) < sigmoid(0.4)).astype(float))
    (a,), (b,) = fit_logistic(x, y, ridge=0.0)
    p = 1 / (1 + np.exp(-(a + b * x)))
    assert abs((y - p).sum()) < 1e-9 and abs(((y - p) * x).sum()) < 1e-9  # the MLE's conditions


def test_a_judge_driven_by_length_alone_is_found_and_warned_about():
    # the longer answer always wins and the policy's is the longer one in 40 of 50 prompts: the
    # data are separable; the (ridge) fit tends to sigmoid(log(40 / 10) / 2) = 2/3 at equal lengths
    y, d = two_lengths(0, 10, 40, 40, d=12.0)
    result = length_controlled_win_rate(y, d)
    assert result["raw_win_rate"] == 0.8
    assert result["win_rate"] == pytest.approx(2 / 3, abs=1e-3)
    assert result["length_coef"] > 5 and result["length_coef_ci95"][0] > 0
    warning = length_bias_warning(result)
    assert warning is not None and "longer" in warning and "0.800" in warning and "0.667" in warning
    matched = length_matched_win_rate(y, d)
    assert matched["n"] == 0 and matched["win_rate"] is None and matched["win_rate_ci95"] == [0.0, 1.0]


def test_no_length_effect_leaves_the_win_rate_and_warns_of_nothing():
    # 7 wins in 10 at every length: the slope is exactly 0 and the intercept logit(0.7)
    y, d = [], []
    for length in (-20, -3, 0, 2, 15):
        y += [1.0] * 7 + [0.0] * 3
        d += [length] * 10
    result = length_controlled_win_rate(y, d)
    assert result["win_rate"] == pytest.approx(0.7, abs=1e-9)
    assert result["length_coef"] == pytest.approx(0.0, abs=1e-9)
    assert length_bias_warning(result) is None
    matched = length_matched_win_rate(y, d)  # |d| <= 2: the 20 pairs at 0 and 2
    assert matched["n"] == 20 and matched["win_rate"] == pytest.approx(0.7)
    assert matched["win_rate_ci95"] == pytest.approx(wilson_interval(14, 20))


def test_all_ties_give_one_half_with_no_spread():
    result = length_controlled_win_rate([0.5] * 6, [-4, -1, 0, 3, 8, 9])
    assert result["win_rate"] == 0.5 and result["raw_win_rate"] == 0.5 and result["length_coef"] == 0.0
    assert result["win_rate_ci95"] == [0.5, 0.5] and length_bias_warning(result) is None
    assert outcomes([1.0, 2.0, 3.0], [1.0, 1.0, 4.0]) == [0.5, 1.0, 0.0]


def test_one_pair_and_no_pair():
    one = length_controlled_win_rate([1.0], [5])
    assert one["n"] == 1 and one["win_rate"] == pytest.approx(1.0) and one["win_rate_ci95"] == [0.0, 1.0]
    assert one["length_coef"] is None and length_bias_warning(one) is None
    none = length_controlled_win_rate([], [])
    assert none["n"] == 0 and none["win_rate"] is None and length_bias_warning(none) is None
    with pytest.raises(ValueError, match="pair up"):
        length_controlled_win_rate([1.0], [])


def test_the_bootstrap_is_seeded():
    rng = np.random.default_rng(0)
    y, d = (rng.random(60) < 0.6).astype(float).tolist(), rng.normal(0, 10, 60).tolist()
    assert length_controlled_win_rate(y, d) == length_controlled_win_rate(y, d)
    assert (
        length_controlled_win_rate(y, d, seed=1)["win_rate_ci95"]
        != length_controlled_win_rate(y, d)["win_rate_ci95"]
    )


def test_the_shorter_wins_baseline_and_the_correlations_by_hand():
    chosen, rejected = [3, 10, 5, 7], [5, 4, 5, 9]  # chosen shorter in pairs 0 and 3, equal in 2
    base = shorter_wins_baseline(chosen, rejected)
    assert base["accuracy"] == pytest.approx(2.5 / 4) and base["equal_length"] == 1
    assert base["accuracy_ci95"] == pytest.approx(wilson_interval(2.5, 4))
    assert shorter_wins_baseline([], [])["accuracy"] is None
    diff = [c - r for c, r in zip(chosen, rejected)]  # -2, 6, 0, -2
    corr = margin_length_correlation([-1.0, 3.0, 0.5, -1.0], diff)
    assert corr["pearson"] == pytest.approx(float(np.corrcoef([-1.0, 3.0, 0.5, -1.0], diff)[0, 1]))
    assert corr["spearman"] == pytest.approx(1.0)  # the same order, ties in the same places
    assert margin_length_correlation([1.0, 2.0], [3, 3])["pearson"] is None  # a constant: no correlation
    assert margin_length_correlation([1.0], [3])["spearman"] is None


def test_words_are_whitespace_separated():
    assert word_count("  a  b\nc\t") == 3 and word_count("") == 0
