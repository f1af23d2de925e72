"""A run that looks fine and is not: a policy that does not move (docs/monitors.md).

A learning rate far too small (5e-7 on a LoRA adapter, whose few weights need 1e-5 to 1e-4) gives
calm curves and learns nothing. `StillPolicyCheck` watches the first `STILL_POLICY_ITERATIONS`
iterations after the warmup and reports once when, in every one, the mean PPO ratio stayed within
`STILL_RATIO` of 1, |approx KL| to the sampling policy and the k3 KL to the reference under `STILL_KL`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

STILL_POLICY_ITERATIONS = 3  # iterations (after the warmup) of a still policy before the warning
STILL_RATIO = 0.02  # |mean ratio - 1| under this in every update counts as not moving
STILL_KL = 1e-3  # |approx KL| and the KL to the reference under this count as not moving
LORA_LR_FLOOR = 1e-5  # a LoRA adapter below this rate is most likely on a full-fine-tuning one

RATIO_KEY, APPROX_KL_KEY, REF_KL_KEY = "policy/ratio_mean", "policy/approx_kl", "kl/k3"
CODE = "policy_not_moving"  # the `code` of the warning's event in metrics.jsonl


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def is_still(metrics: Mapping[str, Any]) -> bool | None:
    """Whether one iteration's update left the policy where it was; None without the KL to the
    reference (nothing to judge). A missing ratio or approx KL (a loss without them) is not held
    against the iteration."""
    ref_kl = _number(metrics.get(REF_KL_KEY))
    if ref_kl is None:
        return None
    ratio, approx_kl = _number(metrics.get(RATIO_KEY)), _number(metrics.get(APPROX_KL_KEY))
    return (
        abs(ref_kl) < STILL_KL
        and (ratio is None or abs(ratio - 1.0) < STILL_RATIO)
        and (approx_kl is None or abs(approx_kl) < STILL_KL)
    )


class StillPolicyCheck:
    """`update(iteration, metrics)` after each RL iteration; returns the warning once, when the
    first `iterations` iterations from `start` (the first after the warmup) were all still, and
    None otherwise. An iteration that moves disarms it for the rest of the session."""

    def __init__(
        self, lr: float, *, lora: bool = False, start: int = 0, iterations: int = STILL_POLICY_ITERATIONS
    ) -> None:
        self.lr, self.lora, self.start, self.iterations = lr, lora, start, iterations
        self.still: list[Mapping[str, Any]] = []
        self.done = False

    def update(self, iteration: int, metrics: Mapping[str, Any]) -> str | None:
        if self.done or iteration < self.start:
            return None
        still = is_still(metrics)
        if still is None:
            return None
        if not still:
            self.done = True
            return None
        self.still.append(metrics)
        if len(self.still) < self.iterations:
            return None
        self.done = True
        return self.message()

    def message(self) -> str:
        worst = {
            key: max(abs(_number(m.get(key)) or 0.0) for m in self.still)
            for key in (APPROX_KL_KEY, REF_KL_KEY)
        }
        ratio = max(abs((_number(m.get(RATIO_KEY)) or 1.0) - 1.0) for m in self.still)
        if self.lora and self.lr < LORA_LR_FLOOR:
            why = (
                f"policy_optim.lr {self.lr:g} is a full-fine-tuning rate on a LoRA adapter, whose few "
                "weights need about 1e-5 to 1e-4"
            )
        else:
            why = f"policy_optim.lr {self.lr:g} is too small for this model"
        return (
            f"the policy has not moved in {len(self.still)} iterations: mean ratio within "
            f"{ratio:.2g} of 1 in every update, |approx KL| at most {worst[APPROX_KL_KEY]:.2g} and KL to "
            f"the reference at most {worst[REF_KL_KEY]:.2g} (under {STILL_KL:g}). The run trains nothing: "
            f"most likely {why}. Fix: raise --policy_optim.lr (10 to 100 times), and check policy/grad_norm."
        )
