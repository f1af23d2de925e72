"""Checks that stop an RL run before a broken model poisons it (one message: what, where, the fix)."""

from __future__ import annotations

import torch


class NonFiniteRewardError(ValueError):
    """The reward model scored responses NaN or infinite."""


def require_finite_scores(scores: torch.Tensor, *, model: str, iteration: int, texts: list[str]) -> None:
    """Raise `NonFiniteRewardError` naming the reward model, the iteration and the rows (with the
    start of each response) whose score is NaN or infinite. Running moments, advantages and every
    metric would turn NaN from such a score on, so the run stops before using it."""
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if not bad:
        return
    shown = "; ".join(f"row {i}: {texts[i][:60]!r}" for i in bad[:4]) + (" ..." if len(bad) > 4 else "")
    raise NonFiniteRewardError(
        f"the reward model {model} gave non-finite scores (nan/inf) to {len(bad)} of {len(scores)} responses "
        f"at iteration {iteration} ({shown}). Nothing of this iteration was used or saved; the last "
        "checkpoint is intact. Fix: the reward model is broken (diverged training or damaged weights): "
        "retrain it with `rlhf rm` (check its metrics.jsonl for a NaN loss) and start a new run."
    )
