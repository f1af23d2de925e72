"""The run's guards against NaN/inf (rlhf/train/guards.py): a non-finite forward stops the run before
it reaches an advantage, and a learner that skipped every optimizer step for NaN/inf gradients in
3 updates in a row stops it (its weights no longer change; `SkippedStepStreak`, shared with the
supervised stages), naming the settings that scale the loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.models.sampling import Rollout
from rlhf.train.guards import NONFINITE_GRADIENTS, SkippedStepStreak, loss_scale_fix, require_finite_tokens


class RunGuards:
    def __init__(self, config: RLConfig, tokenizer: Any) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.skipped_streak = SkippedStepStreak()

    def require_finite_forwards(
        self,
        rollout: Rollout,
        mask: torch.Tensor,
        outputs: dict[str, torch.Tensor | None],
        when: str,
    ) -> None:
        """A NaN/inf log-prob or value inside a response stops the run before it reaches an advantage:
        a silent NaN turns every later weight into NaN. `outputs`: the policy's and the reference's
        log-probs, the critic's values (None without a critic); `when`: the iteration, in words."""
        named = [
            (f"the {role}", "values" if role == "critic" else "log-probs", t) for role, t in outputs.items()
        ]
        checked = [(model, quantity, t) for model, quantity, t in named if t is not None]
        valid = mask.bool()
        if all(bool(torch.isfinite(t[valid]).all()) for _, _, t in checked):
            return
        texts = self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        for model, quantity, tokens in checked:
            require_finite_tokens(
                tokens,
                mask,
                model=model,
                quantity=quantity,
                what=f"responses at {when}:",
                row=lambda i: f"row {i} {texts[i][:60]!r}",
                consequence="Nothing of this iteration was used or saved; the last checkpoint is intact.",
                fix=self.nonfinite_fix(),
            )

    def check_skipped_steps(
        self, stats: dict[str, float], iteration: int, warn: Callable[..., object]
    ) -> None:
        """Warn (`warn(message, step=, code=)`) when optimizer steps were skipped for NaN/inf gradients
        (rlhf/train/optimizer.py); stop when a learner skipped all of them in 3 updates in a row."""
        for prefix, role in (("policy", "policy"), ("value", "critic")):
            skipped = stats.get(f"{prefix}/skipped_step_fraction", 0.0)
            if skipped:
                warn(
                    f"the {role} skipped {skipped:.0%} of this update's optimizer steps: NaN/inf gradients "
                    "(its weights stay as they were for those steps)",
                    step=iteration,
                    code=NONFINITE_GRADIENTS,
                )
            # only an update that skipped every step can stop the run
            fix = self.nonfinite_fix() if skipped >= 1.0 else ""
            self.skipped_streak.update(role, skipped, iteration, fix)

    def nonfinite_fix(self) -> str:
        c = self.config
        return (
            f"a forward or a gradient went non-finite (device {c.train.device}): see policy/ and "
            f"value/skipped_step_fraction and the losses in metrics.jsonl; start again and {loss_scale_fix(c)}"
        )
