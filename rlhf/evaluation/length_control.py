"""A judge not fooled by length (docs/algorithms.md §33): how much of a win rate the answers' lengths
explain, for `rlhf eval` (a judge's preferences between two policies) and `rlhf rm-eval` (a reward
model's preferences between the chosen and the rejected responses).

`length_controlled_win_rate` (length-controlled AlpacaEval, Dubois et al. 2024, arXiv 2404.04475,
with a ridge of `RIDGE`), `length_matched_win_rate`, `length_bias_warning`, and for a reward model
`shorter_wins_baseline` and `margin_length_correlation`. Every function is pure: lists of numbers
in, floats and dicts out (JSON-ready; None where a quantity does not exist)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlhf.evaluation.judging import wilson_interval

RIDGE = 1e-4  # L2 penalty on the (standardized) length coefficient; negligible unless separable
MATCH_TOLERANCE = 2  # length-matched pairs: |difference| <= this (words for eval)
WARN_GAP = 0.05  # raw and length-controlled win rates differing by more than this, with the
# length coefficient's interval excluding 0, make the warning
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0


def word_count(text: str) -> int:
    """Whitespace-separated words."""
    return len(text.split())


def outcomes(a: Sequence[float], b: Sequence[float], tie_tolerance: float = 1e-6) -> list[float]:
    """Per pair, 1 when `a` scores higher, 0 when lower, 1/2 for a tie (|a - b| <= tie_tolerance):
    as `judging.compare_scores` counts them."""
    return [1.0 if x - y > tie_tolerance else 0.0 if x - y < -tie_tolerance else 0.5 for x, y in zip(a, b)]


def _sigmoid(z):
    return 0.5 * (1 + np.tanh(0.5 * z))  # stable for any z


def fit_logistic(x, y, weights=None, ridge: float = RIDGE, iterations: int = 100):
    """Maximum (ridge-)penalized likelihood of P(y=1) = sigmoid(a + b x) for outcomes y in [0, 1]
    (a fractional y, e.g. a tie's 1/2, is that share of a win), by Newton's method.

    `x`, `y`: [n]; `weights`: [B, n] counts of each pair in B resamples (default: one fit, each pair
    once). Returns (a, b), each [B]. The penalty (ridge / 2) b^2 falls on b only, so a feature that
    is 0 everywhere gives b = 0 and a = logit(mean y)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.ones((1, len(x))) if weights is None else np.asarray(weights, dtype=np.float64)
    a, b = np.zeros(len(w)), np.zeros(len(w))
    for _ in range(iterations):
        p = _sigmoid(a[:, None] + b[:, None] * x)
        r, v = w * (y - p), w * p * (1 - p)
        ga, gb = r.sum(1), (r * x).sum(1) - ridge * b  # the gradient of the penalized log-likelihood
        haa, hab, hbb = v.sum(1), (v * x).sum(1), (v * x * x).sum(1) + ridge  # minus its Hessian
        haa = np.maximum(haa, 1e-300)  # all-y-equal data push p to 0 or 1; the step stays finite
        det = haa * hbb - hab * hab
        det = np.where(det > 0, det, 1e-300)
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if max(np.abs(da).max(initial=0), np.abs(db).max(initial=0)) < 1e-12:
            break
    return a, b


def _percentiles(values: np.ndarray) -> list[float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return [float(low), float(high)]


def length_controlled_win_rate(
    outcome: Sequence[float],
    length_difference: Sequence[float],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """The length-controlled win rate of `outcome` (1 win, 0 loss, 1/2 tie per prompt) given each
    prompt's `length_difference` (policy minus baseline), with 95% bootstrap intervals.

    Returns {"n", "raw_win_rate", "win_rate" (at difference 0), "win_rate_ci95", "length_coef"
    (per unit of tanh(d / scale)), "length_coef_ci95", "length_scale" (sd of d; 1 when d is
    constant), "bootstrap": {"samples", "seed"}}. n = 0 gives None figures; n = 1 intervals [0, 1]
    and None: one pair says nothing about its spread."""
    y = np.asarray(outcome, dtype=np.float64)
    d = np.asarray(length_difference, dtype=np.float64)
    if y.shape != d.shape:
        raise ValueError(f"{len(y)} outcomes and {len(d)} length differences: they must pair up")
    n = len(y)
    out = {"n": n, "bootstrap": {"samples": samples, "seed": seed}}
    if n == 0:
        return {**out, "raw_win_rate": None, "win_rate": None, "win_rate_ci95": [0.0, 1.0],
                "length_coef": None, "length_coef_ci95": None, "length_scale": None}  # fmt: skip
    scale = float(d.std()) if n > 1 and float(d.std()) > 0 else 1.0
    x = np.tanh(d / scale)
    a, b = fit_logistic(x, y)
    out.update(
        raw_win_rate=float(y.mean()),
        win_rate=float(_sigmoid(a[0])),
        length_coef=float(b[0]),
        length_scale=scale,
    )
    if n == 1:  # one pair: no length effect to estimate, no spread
        return {**out, "length_coef": None, "win_rate_ci95": [0.0, 1.0], "length_coef_ci95": None}
    if samples < 1:
        return {**out, "win_rate_ci95": [0.0, 1.0], "length_coef_ci95": None}
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=samples)
    boot_a, boot_b = fit_logistic(x, y, weights=counts)
    out["win_rate_ci95"] = _percentiles(_sigmoid(boot_a))
    out["length_coef_ci95"] = _percentiles(boot_b)
    return out


def length_matched_win_rate(
    outcome: Sequence[float], length_difference: Sequence[float], tolerance: float = MATCH_TOLERANCE
) -> dict:
    """The win rate (ties half) over the pairs with |length difference| <= `tolerance`, with its 95%
    Wilson interval; n of them (0: win_rate None, interval [0, 1])."""
    matched = [o for o, d in zip(outcome, length_difference) if abs(d) <= tolerance]
    n = len(matched)
    return {
        "tolerance": tolerance,
        "n": n,
        "win_rate": sum(matched) / n if n else None,
        "win_rate_ci95": wilson_interval(sum(matched), n),
    }


def length_bias_warning(controlled: dict, gap: float = WARN_GAP, unit: str = "words") -> str | None:
    """A sentence when the judge's preference follows length: the length coefficient's 95% interval
    excludes 0 and the raw and length-controlled win rates differ by more than `gap`; else None."""
    interval = controlled.get("length_coef_ci95")
    raw, lc = controlled.get("raw_win_rate"), controlled.get("win_rate")
    if interval is None or raw is None or lc is None:
        return None
    if interval[0] <= 0 <= interval[1] or abs(raw - lc) <= gap:
        return None
    side = "longer" if controlled["length_coef"] > 0 else "shorter"
    return (
        f"the judge's preference follows length: it favours the {side} answer (length coefficient "
        f"{controlled['length_coef']:+.2f}, 95% interval [{interval[0]:+.2f}, {interval[1]:+.2f}], per "
        f"tanh(difference / {controlled['length_scale']:.1f} {unit})); the raw win rate {raw:.3f} is "
        f"{lc:.3f} at equal lengths. Read the length-controlled and length-matched win rates."
    )


def shorter_wins_baseline(chosen_lengths: Sequence[int], rejected_lengths: Sequence[int]) -> dict:
    """The accuracy on preference pairs of the rule "the shorter response is the chosen one" (a pair
    of equal lengths counts 1/2, a coin flip), with its 95% Wilson interval; 1 minus it is the
    "longer wins" rule's."""
    n = len(chosen_lengths)
    shorter = sum(1 for c, r in zip(chosen_lengths, rejected_lengths) if c < r)
    equal = sum(1 for c, r in zip(chosen_lengths, rejected_lengths) if c == r)
    right = shorter + 0.5 * equal
    return {
        "n": n,
        "chosen_shorter": shorter,
        "equal_length": equal,
        "accuracy": right / n if n else None,
        "accuracy_ci95": wilson_interval(right, n),
    }


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 2 or float(x.std()) == 0 or float(y.std()) == 0:
        return None
    return float(np.clip(np.corrcoef(x, y)[0, 1], -1.0, 1.0))


def _ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    sorted_v = v[order]
    start = 0
    for end in range(1, len(v) + 1):
        if end == len(v) or sorted_v[end] != sorted_v[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def margin_length_correlation(margins: Sequence[float], length_difference: Sequence[float]) -> dict:
    """Pearson's and Spearman's correlations of the reward margins with the length differences
    (chosen minus rejected); None where either is constant or n < 2. Positive: the reward model's
    margin grows with the chosen response's extra length."""
    m = np.asarray(margins, dtype=np.float64)
    d = np.asarray(length_difference, dtype=np.float64)
    return {
        "n": len(m),
        "pearson": _pearson(m, d),
        "spearman": _pearson(_ranks(m), _ranks(d)) if len(m) else None,
    }


def judge_length_bias(
    policy_texts: Sequence[str],
    baseline_texts: Sequence[str],
    policy_scores: Sequence[float],
    baseline_scores: Sequence[float],
    *,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """`rlhf eval`'s length figures of the policy against the baseline, lengths in words: the mean
    lengths, the length-controlled win rate, the length-matched win rate and the warning (None when
    the preference does not follow length)."""
    difference = [word_count(p) - word_count(b) for p, b in zip(policy_texts, baseline_texts)]
    outcome = outcomes(policy_scores, baseline_scores)
    controlled = length_controlled_win_rate(outcome, difference, seed=seed)
    n = len(difference)
    return {
        "unit": "words",
        "policy_mean_length": sum(map(word_count, policy_texts)) / n if n else None,
        "baseline_mean_length": sum(map(word_count, baseline_texts)) / n if n else None,
        "length_controlled": controlled,
        "length_matched": length_matched_win_rate(outcome, difference),
        "warning": length_bias_warning(controlled),
    }


def reward_model_length_bias(
    margins: Sequence[float], chosen_lengths: Sequence[int], rejected_lengths: Sequence[int]
) -> dict:
    """`rlhf rm-eval`'s length figures, lengths in response tokens: the "shorter wins" baseline on the
    same pairs and the correlations of the margin with the length difference (chosen - rejected)."""
    difference = [c - r for c, r in zip(chosen_lengths, rejected_lengths)]
    n = len(difference)
    return {
        "unit": "tokens",
        "chosen_mean_length": sum(chosen_lengths) / n if n else None,
        "rejected_mean_length": sum(rejected_lengths) / n if n else None,
        "shorter_wins": shorter_wins_baseline(chosen_lengths, rejected_lengths),
        "margin_correlation": margin_length_correlation(margins, difference),
    }
