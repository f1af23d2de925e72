"""The stats of an RL update from those of its optimizer steps (each step's own: `StepStats`,
rlhf/train/learner.py)."""

from __future__ import annotations


def mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """The stats of an update from those of its optimizer steps: the mean over the steps that have a
    key (each step is one minibatch's token mean), `_max`/`_min` keys by max/min."""
    merged: dict[str, list[float]] = {}
    for stats in steps:
        for key, value in stats.items():
            merged.setdefault(key, []).append(value)
    out = {}
    for key, values in merged.items():
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out
