"""The ablation's numbers: gold gain at a KL budget, t intervals over seeds, paired differences."""

from __future__ import annotations

import math
import statistics

# Student t quantiles t_{0.975, df}, df = 1..30 (beyond: the normal 1.96 is within 2%)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96


def mean_ci(values: list[float]) -> dict:
    """Mean and 95% t interval over seeds ({"mean", "ci95": [low, high], "n"}; one seed: no interval)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": mean, "ci95": None, "n": n}
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": n}


def gold_at_kl(trajectory: list[tuple[float, float]], budget: float) -> tuple[float, bool]:
    """(gold where the run first spends `budget` of KL, whether it did): `trajectory` is
    [(kl, gold)] in evaluation order from the SFT point (0, gold_sft); the gold is interpolated
    linearly between the two evaluations around the first crossing. A run that never reaches the
    budget gives its last gold (and False)."""
    for (kl0, g0), (kl1, g1) in zip(trajectory, trajectory[1:]):
        if kl0 < budget <= kl1:
            return g0 + (g1 - g0) * (budget - kl0) / (kl1 - kl0), True
    return trajectory[-1][1], False


def verdict(difference: dict) -> str:
    """What switching the trick did to a metric, read off the paired interval: "no measurable effect"
    when it holds 0 (or there is one seed), else "lower"/"higher"."""
    ci = difference.get("ci95")
    if ci is None or ci[0] <= 0 <= ci[1]:
        return "no measurable effect"
    return "higher" if ci[0] > 0 else "lower"
