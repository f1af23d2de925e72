"""Accuracy on a verifiable task (rlhf/evaluation/accuracy.py, docs/algorithms.md §40): the Wilson
interval of a 0/1 verifier, the t interval otherwise, the paired difference, each against closed
forms and plain float64 loops."""

from __future__ import annotations

import math

import pytest

from rlhf.evaluation.accuracy import function_figures, mean_figures, paired_difference, t_quantile_975

Z = 1.959963984540054
W = 1.96  # the z of the Wilson intervals of every eval.json figure (judging.wilson_interval)
# t_{0.975, df} from the standard tables
T_TABLE = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 5: 2.570581836,
           10: 2.228138852, 30: 2.042272456, 200: 1.971896224, 1000: 1.962339081}  # fmt: skip


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_tables(df):
    assert t_quantile_975(df) == pytest.approx(T_TABLE[df], abs=2e-9)


def test_t_quantile_series_and_exact_cdf_agree_where_they_meet_and_tend_to_z():
    import rlhf.evaluation.accuracy as accuracy

    series = t_quantile_975(accuracy.EXACT_T_UP_TO + 1)
    exact = accuracy._t_two_sided_mass(series, accuracy.EXACT_T_UP_TO + 1)
    assert exact == pytest.approx(0.95, abs=1e-10)
    assert t_quantile_975(10**7) == pytest.approx(Z, abs=1e-6)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre = (p + W * W / (2 * n)) / (1 + W * W / n)
    half = W * math.sqrt(p * (1 - p) / n + W * W / (4 * n * n)) / (1 + W * W / n)
    return centre - half, centre + half


def test_a_verifier_gets_its_accuracy_with_the_wilson_interval():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    got = mean_figures(values, binary=True)
    assert (got["n"], got["correct"], got["interval"]) == (7, 5, "wilson")
    assert got["mean"] == pytest.approx(5 / 7)
    assert got["ci95"] == pytest.approx(wilson_by_hand(5, 7), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_wilson_at_all_correct_and_all_wrong_stays_in_0_1_with_its_closed_form(n):
    right = mean_figures([1.0] * n, binary=True)
    wrong = mean_figures([0.0] * n, binary=True)
    # p = 1: low = n / (n + z^2), high 1; p = 0: low 0, high z^2 / (n + z^2)
    assert right["ci95"][0] == pytest.approx(n / (n + W * W), abs=1e-12) and right["ci95"][1] == 1.0
    assert wrong["ci95"][0] == 0.0 and wrong["ci95"][1] == pytest.approx(W * W / (n + W * W), abs=1e-12)
    assert (right["mean"], right["correct"], wrong["mean"], wrong["correct"]) == (1.0, n, 0.0, 0)


def t_by_hand(values: list[float]) -> tuple[float, list[float]]:
    n = len(values)
    mean = 0.0
    for v in values:
        mean += v / n
    var = 0.0
    for v in values:
        var += (v - mean) ** 2 / (n - 1)
    half = T_TABLE[n - 1] * math.sqrt(var / n)
    return mean, [mean - half, mean + half]


def test_another_reward_gets_the_t_interval():
    values = [0.5, 1.5, 2.0]
    got = mean_figures(values, binary=False)
    mean, interval = t_by_hand(values)
    assert (got["interval"], got["n"]) == ("t", 3) and "correct" not in got
    assert got["mean"] == pytest.approx(mean) and got["ci95"] == pytest.approx(interval, abs=1e-8)
    one = mean_figures([2.5], binary=False)  # a batch of one: no t interval
    assert (one["mean"], one["ci95"], one["n"]) == (2.5, None, 1)


def test_the_paired_difference_against_a_plain_loop():
    policy = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    baseline = [0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    got = paired_difference(policy, baseline)
    diff = [a - b for a, b in zip(policy, baseline)]
    mean, interval = t_by_hand(diff)
    assert (got["wins"], got["ties"], got["losses"], got["n"]) == (2, 3, 1, 6)
    assert got["mean"] == pytest.approx(mean) and got["ci95"] == pytest.approx(interval, abs=1e-8)
    assert got["interval"] == "t"
    one = paired_difference([0.0], [1.0])  # a batch of one
    assert (one["mean"], one["ci95"], one["losses"], one["wins"], one["ties"]) == (-1.0, None, 1, 0, 0)
    same = paired_difference([1.0, 0.0], [1.0, 0.0])  # equal everywhere: a zero-width interval at 0
    assert (same["mean"], same["ci95"], same["ties"]) == (0.0, [0.0, 0.0], 2)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 0.0])


def test_wilson_only_when_both_sides_are_0_or_1():
    verifier = function_figures([1.0, 0.0, 1.0], [0.0, 0.0, 1.0])
    assert verifier["interval"] == verifier["baseline"]["interval"] == "wilson"
    assert verifier["difference"]["mean"] == pytest.approx(1 / 3)
    graded = function_figures([1.0, 0.0, 1.0], [0.5, 0.0, 1.0])  # a 0.5 on the baseline: not a verifier
    assert graded["interval"] == graded["baseline"]["interval"] == "t"
    alone = function_figures([1.0, 1.0])
    assert "baseline" not in alone and "difference" not in alone and alone["ci95"][1] == 1.0
