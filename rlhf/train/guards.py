"""One check for every stage that scores with a model (RL rewards, `rlhf eval`'s judge, `rlhf
rm-eval`) or reads a model's per-token outputs (the critic's values, the log-probs of the RL
rollout): a NaN or infinite number stops the command before it is used, with one message naming
the model, the rows and the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NONFINITE_GRADIENTS = "nonfinite_gradients"  # the warning's code when optimizer steps were skipped


class NonFiniteScoresError(ValueError):
    """A model gave NaN or infinite scores: no mean, advantage or win rate can be computed from them."""


def require_finite_scores(scores: torch.Tensor, **message: Any) -> None:
    """Raise `NonFiniteScoresError` when a score [B] is NaN or infinite: "`model` gave non-finite
    scores (nan/inf) to n of N `what` `row(i)`, ... (the first `limit` such rows). `consequence`
    Fix: `fix`" (`message`: require_finite_tokens's keywords, `quantity` aside)."""
    require_finite_tokens(
        scores[:, None], torch.ones(len(scores), 1, dtype=torch.bool), quantity="scores", **message
    )


def require_finite_tokens(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    model: str,
    quantity: str,
    what: str,
    row: Callable[[int], str],
    consequence: str,
    fix: str,
    limit: int = 4,
) -> None:
    """`require_finite_scores` for per-token tensors [B, T] (values, log-probs): a row is bad when a
    token inside `mask` is NaN or infinite (padding may hold anything: the losses never read it)."""
    bad = (~torch.isfinite(values) & mask.bool().to(values.device)).any(dim=1).nonzero().flatten().tolist()
    if not bad:
        return
    shown = ", ".join(row(i) for i in bad[:limit]) + (f" ... ({len(bad)} in all)" if len(bad) > limit else "")
    raise NonFiniteScoresError(
        f"{model} gave non-finite {quantity} (nan/inf) to {len(bad)} of {len(values)} {what} {shown}. "
        f"{consequence} Fix: {fix}"
    )
