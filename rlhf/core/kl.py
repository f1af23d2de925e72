"""The KL-coefficient controllers of the reward's per-token KL penalty (docs/algorithms.md §9).

The per-token KL estimators they are fed from (`kl_estimate`, k1/k2/k3) live in rlhf/core/losses.py,
next to the losses that use them as a term.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import Tensor


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
