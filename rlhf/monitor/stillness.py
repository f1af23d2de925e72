"""A run that looks fine and is not: a policy that does not move (docs/monitors.md).

A learning rate far too small (5e-7 on a LoRA adapter, whose few weights need 1e-5 to 1e-4) gives
calm curves and learns nothing. `StillPolicyCheck` watches the first `STILL_POLICY_ITERATIONS`
iterations after the warmup and reports once when, in every one, the mean PPO ratio stayed within
`STILL_RATIO` of 1, |approx KL| to the sampling policy and the k3 KL to the reference under `STILL_KL`.
A step with nothing to learn from is still too: the warning then names what removed the signal
(truncated drop, DAPO's dynamic sampling, every group at one reward) before the learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STILL_POLICY_ITERATIONS = 3  # iterations (after the warmup) of a still policy before the warning
STILL_RATIO = 0.02  # |mean ratio - 1| under this in every update counts as not moving
STILL_KL = 1e-3  # |approx KL| and the KL to the reference under this count as not moving
LORA_LR_FLOOR = 1e-5  # a LoRA adapter below this rate is most likely on a full-fine-tuning one

RATIO_KEY, APPROX_KL_KEY, REF_KL_KEY = "policy/ratio_mean", "policy/approx_kl", "kl/k3"
KEPT_KEY = "rollout/kept_fraction"  # responses kept for training (rollout.truncated drop removes some)
INFORMATIVE_KEY = "dynamic_sampling/informative_fraction"  # DAPO: groups drawn with two rewards or more
FLAT_KEY = "group/zero_std_fraction"  # groups whose kept rows all scored the same
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


@dataclass(frozen=True)
class RunSettings:
    """The settings a still policy's warning names in its fix (those of `rlhf train`'s config)."""

    temperature: float = 1.0
    max_new_tokens: int = 0
    samples_per_prompt: int = 1
    truncated: str = "keep"  # rollout.truncated: keep | penalize | drop
    critic_free: bool = False  # a group-relative estimator (GRPO, RLOO, DAPO, ...): no critic

    @classmethod
    def of(cls, config: Any) -> RunSettings:
        """Those of an RLConfig."""
        r = config.rollout
        return cls(r.temperature, r.max_new_tokens, r.samples_per_prompt, r.truncated, not config.uses_critic)


class StillPolicyCheck:
    """`update(iteration, metrics)` after each RL iteration; returns the warning once, when the
    first `iterations` iterations from `start` (the first after the warmup) were all still, and
    None otherwise. An iteration that moves disarms it for the rest of the session."""

    def __init__(
        self,
        lr: float,
        *,
        lora: bool = False,
        start: int = 0,
        iterations: int = STILL_POLICY_ITERATIONS,
        run: RunSettings | None = None,
    ) -> None:
        self.lr, self.lora, self.start, self.iterations = lr, lora, start, iterations
        self.run = run or RunSettings()
        self.still: list[Mapping[str, Any]] = []
        self.done = False

    @classmethod
    def of(cls, config: Any, start: int = 0) -> StillPolicyCheck:
        """The check of an RLConfig's run (its policy's lr, LoRA, the rollout settings its fix names)."""
        return cls(
            config.policy_optim.lr, lora=config.model.lora.enabled, start=start, run=RunSettings.of(config)
        )

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

    def count_still(self, key: str, value: float) -> int:
        """How many still iterations logged `key` at `value`."""
        return sum(_number(m.get(key)) == value for m in self.still)

    def nothing_to_learn(self) -> str | None:
        """What removed the rows' signal in most of the still iterations (all: the learning rate is
        not named; most: named last), with the fix; None: nothing did."""
        run, n = self.run, len(self.still)
        budget = (
            f"--rollout.max_new_tokens (now {run.max_new_tokens})"
            if run.max_new_tokens
            else "--rollout.max_new_tokens"
        )
        varied = (
            f"more varied responses (raise --rollout.temperature (now {run.temperature:g}) or "
            f"--rollout.samples_per_prompt (now {run.samples_per_prompt})), room to differ (raise {budget}: "
            "responses cut alike score alike), a reward that tells responses apart (a constant reward function "
            "or model scores every response the same)"
        )
        causes = []
        if (k := self.count_still(KEPT_KEY, 0.0)) * 2 >= n:
            limit = (
                f"rollout.max_new_tokens {run.max_new_tokens}"
                if run.max_new_tokens
                else "rollout.max_new_tokens"
            )
            causes.append(
                (
                    k,
                    f"rollout.truncated {run.truncated} removed every response ({KEPT_KEY} 0): each hit "
                    f"{limit} before its EOS, so no row was left to learn from",
                    f"raise {budget} (responses need room to end), or --rollout.truncated penalize / keep",
                )
            )
        elif (k := self.count_still(INFORMATIVE_KEY, 0.0)) * 2 >= n:
            causes.append(
                (
                    k,
                    f"DAPO's dynamic sampling found no group with two different rewards ({INFORMATIVE_KEY} "
                    "0): every group of every round scored one reward, so every advantage was 0",
                    varied,
                )
            )
        elif run.critic_free and (k := self.count_still(FLAT_KEY, 1.0)) * 2 >= n:
            causes.append(
                (
                    k,
                    f"every group scored one reward ({FLAT_KEY} 1): a group-relative estimator's "
                    "advantages were all 0",
                    varied,
                )
            )
        if not causes:
            return None
        k, what, fix = causes[0]
        when = f"in all {n} iterations" if k == n else f"in {k} of the {n} iterations"
        last = (
            f"; only then the learning rate (policy_optim.lr {self.lr:g})"
            if k < n or FLAT_KEY in what
            else " (the learning rate is not the cause)"
        )
        return f"{when}, {what}. Fix, in this order: {fix}{last}."

    def message(self) -> str:
        worst = {
            key: max(abs(_number(m.get(key)) or 0.0) for m in self.still)
            for key in (APPROX_KL_KEY, REF_KL_KEY)
        }
        ratio = max(abs((_number(m.get(RATIO_KEY)) or 1.0) - 1.0) for m in self.still)
        cause = self.nothing_to_learn()
        if cause is not None:
            return f"the policy has not moved in {len(self.still)} iterations: {cause}"
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
