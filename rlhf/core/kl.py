"""Per-token KL estimators and the KL-coefficient controllers (docs/algorithms.md §7 and §9).

With ``d = logp - ref_logp`` for tokens sampled from the policy whose log-prob is `logp`
(Schulman, "Approximating KL divergence", 2020):

    k1 = d                    unbiased for KL(policy || ref); negative on some tokens
    k2 = d^2 / 2              biased, >= 0
    k3 = exp(-d) - 1 + d      unbiased, >= 0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from torch import Tensor

from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked

KLKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: KLKind = "k1", mask: Tensor | None = None) -> Tensor:
    """Per-token estimate of KL(policy || ref) from the sampled tokens' log-probs, same shape as `logp`.

    With `mask`, masked positions are 0 and never read; without it every position is computed.
    """
    check_same_shape(logp, "logp", ref_logp=ref_logp)
    valid = None
    if mask is not None:
        valid = as_bool_mask(mask, logp, name="logp")
        logp, ref_logp = fill_masked(logp, valid), fill_masked(ref_logp, valid)
    d = logp - ref_logp
    if kind == "k1":
        kl = d
    elif kind == "k2":
        kl = 0.5 * d.square()
    elif kind == "k3":
        # expm1 keeps precision for small d; the clamp only removes rounding below 0.
        kl = (d.neg().expm1() + d).clamp_min(0.0)
    else:
        raise ValueError(f"unknown KL estimator {kind!r}: choose one of {', '.join(KL_KINDS)}")
    return kl if valid is None else fill_masked(kl, valid)


def _as_float(value: float | Tensor, name: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}: check the KL and reward for NaN/inf")
    return number


class FixedKLController:
    """A constant KL coefficient beta; ``update`` does nothing (same interface as the adaptive one)."""

    def __init__(self, value: float) -> None:
        self.value = _as_float(value, "KL coefficient")
        if self.value < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {self.value}")

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = _as_float(state["value"], "KL controller state 'value'")


class AdaptiveKLController:
    """Proportional control of beta towards a target KL (Ziegler et al. 2019 §2.2; trlX, APA paper).

        e    = clip(current_kl / target - 1, -0.2, 0.2)
        beta = beta * (1 + e * n_steps / horizon)

    `current_kl` is the mean over samples of the per-sequence summed KL, `n_steps` the number of
    samples since the last update. Defaults elsewhere: init 0.05, target 6, horizon 10000.
    """

    def __init__(self, init: float, target: float, horizon: float) -> None:
        self.value = _as_float(init, "init")
        self.target = _as_float(target, "target")
        self.horizon = _as_float(horizon, "horizon")
        if self.value < 0 or self.target <= 0 or self.horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController needs init >= 0, target > 0, horizon > 0; "
                f"got init={init}, target={target}, horizon={horizon}"
            )

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        kl = _as_float(current_kl, "current_kl")
        if not 0 <= n_steps <= self.horizon:
            # Above the horizon, 1 + e * n_steps / horizon could reach 0 or below: beta would flip sign.
            raise ValueError(
                f"n_steps={n_steps} must be in [0, horizon={self.horizon:g}]: the update is a small "
                "proportional step; use a horizon much larger than the number of samples per update"
            )
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = _as_float(state["value"], "KL controller state 'value'")
