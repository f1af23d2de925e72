"""Statistics of a reward model on preference pairs, from the margins m = r(chosen) - r(rejected).

- accuracy: the share of pairs with m > 0 (a tie is not correct), with its 95% Wilson interval;
- the margin distribution: quantiles and a histogram on bins symmetric around 0;
- calibration: read as a Bradley-Terry model, the preferred response is better with probability
  sigmoid(|m|); pairs binned by that confidence give the reliability table, and the expected
  calibration error is the pair-weighted mean |accuracy - confidence| (a tie counts half right);
- the worst pairs: the most negative margins."""

from __future__ import annotations

import math

import torch

from rlhf.evaluation.judging import wilson_interval

QUANTILES = {"min": 0.0, "p05": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95, "max": 1.0}


def _as_float64(margins) -> torch.Tensor:
    return torch.as_tensor(margins, dtype=torch.float64).flatten()


def accuracy_stats(margins) -> dict:
    """n, correct (m > 0), ties (m == 0), accuracy and its 95% Wilson interval."""
    m = _as_float64(margins)
    n, correct, ties = len(m), int((m > 0).sum()), int((m == 0).sum())
    return {
        "n": n,
        "correct": correct,
        "ties": ties,
        "accuracy": correct / n if n else 0.0,
        "accuracy_ci95": wilson_interval(correct, n),
    }


def margin_stats(margins) -> dict:
    """Mean, std (n - 1), the ranking loss -mean log sigmoid(m) and the quantiles of `QUANTILES`
    (linear interpolation between order statistics)."""
    m = _as_float64(margins)
    if not len(m):
        return {}
    out = {
        "mean": float(m.mean()),
        "std": float(m.std()) if len(m) > 1 else 0.0,
        "rank_loss": float(-torch.nn.functional.logsigmoid(m).mean()),
    }
    values = torch.quantile(m, torch.tensor(list(QUANTILES.values()), dtype=torch.float64))
    out.update({name: float(v) for name, v in zip(QUANTILES, values)})
    return out


def margin_histogram(margins, bins: int = 10) -> dict:
    """Counts on `bins` (even) equal bins over [-R, R], R = max |m| (1 when every margin is 0): 0 is
    an edge, so the left half counts the pairs ranked the wrong way. A bin holds [low, high), the
    last one [low, R]; a margin of exactly 0 falls in the first bin right of 0."""
    if bins < 2 or bins % 2:
        raise ValueError(f"bins must be an even number >= 2, got {bins}")
    m = _as_float64(margins)
    reach = float(m.abs().max()) if len(m) else 0.0
    reach = reach if reach > 0 else 1.0
    edges = [reach * (2 * i / bins - 1) for i in range(bins + 1)]
    edges[bins // 2] = 0.0  # exact, whatever the rounding of the line above
    index = ((m + reach) / (2 * reach) * bins).floor().clamp(0, bins - 1).long()
    index = torch.where(m == 0, torch.full_like(index, bins // 2), index)
    counts = torch.bincount(index, minlength=bins).tolist()
    return {"edges": edges, "counts": counts}


def correctness(margins) -> torch.Tensor:
    """1 for m > 0, 1/2 for a tie, 0 for m < 0 (the expected score of a coin flip on a tie)."""
    m = _as_float64(margins)
    return (m > 0).double() + 0.5 * (m == 0).double()


def calibration(margins, bins: int = 10) -> dict:
    """The reliability table ({low, high, n, confidence, accuracy} per bin of sigmoid(|m|) over
    [0.5, 1]; an empty bin has None for both means) and the expected calibration error `ece`."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    m = _as_float64(margins)
    confidence = torch.sigmoid(m.abs())
    right = correctness(m)
    index = ((confidence - 0.5) * 2 * bins).floor().clamp(0, bins - 1).long()
    table, ece = [], 0.0
    for b in range(bins):
        member = index == b
        count = int(member.sum())
        row = {"low": 0.5 + b / (2 * bins), "high": 0.5 + (b + 1) / (2 * bins), "n": count}
        if count:
            conf, acc = float(confidence[member].mean()), float(right[member].mean())
            row.update(confidence=conf, accuracy=acc)
            ece += count / len(m) * abs(acc - conf)
        else:
            row.update(confidence=None, accuracy=None)
        table.append(row)
    mean_confidence = float(confidence.mean()) if len(m) else 0.0
    mean_right = float(right.mean()) if len(m) else 0.0
    return {
        "bins": table,
        "ece": ece,
        "mean_confidence": mean_confidence,
        "mean_accuracy": mean_right,
        "overconfidence": mean_confidence - mean_right,  # > 0: the margins claim more than they deliver
    }


def worst_indices(margins, k: int) -> list[int]:
    """The indices of the `k` most negative margins, most negative first (file order among equals)."""
    m = _as_float64(margins)
    order = sorted(range(len(m)), key=lambda i: (float(m[i]), i))
    return order[: max(k, 0)]


def summarize_margins(margins, *, histogram_bins: int = 10, calibration_bins: int = 10) -> dict:
    """Everything above for one set of margins (without the worst pairs, which need the texts)."""
    m = _as_float64(margins)
    if not bool(torch.isfinite(m).all()):
        bad = int((~torch.isfinite(m)).sum())
        raise ValueError(f"{bad} of {len(m)} margins are not finite (nan/inf)")
    return {
        **accuracy_stats(m),
        "margin": margin_stats(m),
        "histogram": margin_histogram(m, histogram_bins),
        "calibration": calibration(m, calibration_bins),
    }


def sigmoid(x: float) -> float:
    """The logistic function, stable for large |x| (for readers of single margins)."""
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
