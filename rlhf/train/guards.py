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


class SkippedStepStreak:
    """Stops a run whose learner skipped every optimizer step (NaN/inf gradients, rlhf/train/optimizer.py)
    in `patience` updates (RL iterations) or steps (supervised) in a row: its weights no longer change,
    so going on only burns compute. The fix names the settings that scale the loss (`loss_scale_fix`)."""

    def __init__(self, patience: int = 3, unit: str = "updates") -> None:
        self.patience, self.unit = patience, unit
        self.streaks: dict[str, int] = {}

    def update(self, role: str, skipped_fraction: float, iteration: int, fix: str) -> None:
        self.streaks[role] = self.streaks.get(role, 0) + 1 if skipped_fraction >= 1.0 else 0
        if self.streaks[role] >= self.patience:
            where = "iteration" if self.unit == "updates" else "step"
            raise NonFiniteScoresError(
                f"the {role} skipped every optimizer step for NaN/inf gradients in {self.patience} {self.unit} in a "
                f"row (to {where} {iteration}): its weights stopped changing. The last checkpoint holds the "
                f"weights before. Fix: {fix}"
            )


def loss_scale_fix(config: Any) -> str:
    """The fix of a run whose every step was skipped for NaN/inf gradients: the settings of `config`
    (a stage config) that scale its loss and gradients, with their values, and the precision."""
    names: list[str] = []
    if hasattr(config, "dpo"):  # DPO and its variants: beta multiplies the log-ratio margin (§32)
        names.append(f"dpo.beta {config.dpo.beta:g}")
        if config.dpo.loss == "simpo":
            names.append(f"dpo.simpo_gamma {config.dpo.simpo_gamma:g}")
    if hasattr(config, "policy_optim"):  # rlhf train: the policy's and the critic's steps
        names += [f"policy_optim.lr {config.policy_optim.lr:g}", f"policy.clip_eps {config.policy.clip_eps:g}",
                  f"kl.beta {config.kl.beta:g}", f"policy.kl_loss_coef {config.policy.kl_loss_coef:g}",
                  f"policy.entropy_coef {config.policy.entropy_coef:g}"]  # fmt: skip
        if config.uses_critic:
            names.append(f"critic_optim.lr {config.critic_optim.lr:g}")
        names.append(f"reward.clip {config.reward.clip}")
    else:
        names.append(f"optim.lr {config.optim.lr:g}")
    if hasattr(getattr(config, "train", None), "lm_coef"):  # rlhf rm: the LM term beside the ranking loss
        names.append(f"train.lm_coef {config.train.lm_coef:g}")
    return (
        f"lower the settings that scale the loss and its gradients ({', '.join(names)}); with dtype "
        f"{config.dtype}, --dtype float32 rules out an overflow of the precision."
    )
