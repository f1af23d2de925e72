"""Accuracy on a verifiable task: the mean of one reward function's values over the prompts with its 95%
interval, and, against a baseline, the paired difference (docs/algorithms.md §40).

- A function whose values are all 0 or 1 is a verifier: its mean is an accuracy, with the Wilson
  score interval (`interval: "wilson"`; inside [0, 1] even at 0 or n correct, sane for small n).
- Any other function: the mean with Student's t interval, mean ± t_{0.975, n-1} s / sqrt(n)
  (`interval: "t"`; s the sample standard deviation; None for n < 2).
- Paired difference d_i = policy_i - baseline_i on the same prompt: mean(d) with the t interval of
  the d_i (the paired t interval), and the prompts where the policy scored higher, equal, lower.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlhf.evaluation.judging import TIE_TOLERANCE, wilson_interval

Z_975 = 1.959963984540054  # the standard normal's 0.975 quantile
EXACT_T_UP_TO = 200  # degrees of freedom solved from the exact CDF; beyond, the Cornish-Fisher series


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer `df` (Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}, the critical value of a two-sided 95% t interval: bisection on the exact CDF up
    to `EXACT_T_UP_TO` degrees of freedom, the Cornish-Fisher series (A&S 26.7.5) beyond (error < 1e-9)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > EXACT_T_UP_TO:
        x, n = Z_975, float(df)
        g1 = (x**3 + x) / 4
        g2 = (5 * x**5 + 16 * x**3 + 3 * x) / 96
        g3 = (3 * x**7 + 19 * x**5 + 17 * x**3 - 15 * x) / 384
        g4 = (79 * x**9 + 776 * x**7 + 1482 * x**5 - 1920 * x**3 - 945 * x) / 92160
        return x + g1 / n + g2 / n**2 + g3 / n**3 + g4 / n**4
    low, high = Z_975, 13.0  # t_{0.975, 1} = 12.706...
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_two_sided_mass(mid, df) < 0.95 else (low, mid)
    return (low + high) / 2


def is_binary(values: Sequence[float]) -> bool:
    """Every value is exactly 0 or 1 (a verifier's verdicts)."""
    return all(v in (0.0, 1.0) for v in values)


def t_interval(values: Sequence[float]) -> tuple[float, float, list[float] | None]:
    """(mean, sample std, the 95% t interval of the mean); float64; interval None for n < 2."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0, None
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0, None
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return mean, std, [mean - half, mean + half]


def mean_figures(values: Sequence[float], binary: bool) -> dict:
    """{mean, ci95, n, interval, std} of one side, and `correct` (the count of 1s) for a verifier."""
    values = [float(v) for v in values]
    n = len(values)
    mean, std, interval = t_interval(values)
    if binary:
        correct = int(sum(values))
        return {"mean": mean, "ci95": wilson_interval(correct, n), "n": n, "interval": "wilson",
                "correct": correct, "std": std}  # fmt: skip
    return {"mean": mean, "ci95": interval, "n": n, "interval": "t", "std": std}


def paired_difference(policy: Sequence[float], baseline: Sequence[float]) -> dict:
    """{mean, ci95, n, interval: "t", std, wins, ties, losses} of d_i = policy_i - baseline_i; a
    |d_i| <= TIE_TOLERANCE is a tie (as the win rates count)."""
    if len(policy) != len(baseline):
        raise ValueError(f"paired values differ in length: {len(policy)} vs {len(baseline)}")
    diff = [float(a) - float(b) for a, b in zip(policy, baseline)]
    mean, std, interval = t_interval(diff)
    wins = sum(d > TIE_TOLERANCE for d in diff)
    losses = sum(d < -TIE_TOLERANCE for d in diff)
    return {"mean": mean, "ci95": interval, "n": len(diff), "interval": "t", "std": std,
            "wins": wins, "ties": len(diff) - wins - losses, "losses": losses}  # fmt: skip


def function_figures(policy: Sequence[float], baseline: Sequence[float] | None = None) -> dict:
    """One reward function's entry of eval.json's `reward_functions`: the policy's figures at the top
    level; with a baseline, its figures under `baseline` and the paired `difference`. Both sides use
    Wilson when every value of both is 0 or 1."""
    binary = is_binary(list(policy) + list(baseline or []))
    out = mean_figures(policy, binary)
    if baseline is not None:
        out["baseline"] = mean_figures(baseline, binary)
        out["difference"] = paired_difference(policy, baseline)
    return out
