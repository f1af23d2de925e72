"""One check for every stage that scores with a model (RL rewards, `rlhf eval`'s judge, `rlhf
rm-eval`): a NaN or infinite score stops the command before it is used, with one message naming
the model, the rows and the fix."""

from __future__ import annotations

from collections.abc import Callable

import torch


class NonFiniteScoresError(ValueError):
    """A model gave NaN or infinite scores: no mean, advantage or win rate can be computed from them."""


def require_finite_scores(
    scores: torch.Tensor,
    *,
    model: str,
    what: str,
    row: Callable[[int], str],
    consequence: str,
    fix: str,
    limit: int = 4,
) -> None:
    """Raise `NonFiniteScoresError` when a score is NaN or infinite: "`model` gave non-finite scores
    (nan/inf) to n of N `what` `row(i)`, ... (the first `limit` such rows). `consequence` Fix: `fix`"."""
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if not bad:
        return
    shown = ", ".join(row(i) for i in bad[:limit]) + (f" ... ({len(bad)} in all)" if len(bad) > limit else "")
    raise NonFiniteScoresError(
        f"{model} gave non-finite scores (nan/inf) to {len(bad)} of {len(scores)} {what} {shown}. "
        f"{consequence} Fix: {fix}"
    )
