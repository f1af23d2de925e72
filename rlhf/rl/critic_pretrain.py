"""Critic pre-training's progress (PPO paper §5.3.3: value loss only, the policy frozen, before RL):
it stops after `critic.pretrain_iterations`, or early once the value loss plateaus."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlhf.config import RLConfig


@dataclass
class PretrainState:
    """Iterations done, the best value loss, iterations since it improved."""

    iterations: int = 0
    best: float = math.inf
    stale: int = 0

    def record(self, loss: float, config: RLConfig) -> bool:
        """One more iteration's value loss; whether pre-training is done: `critic.pretrain_iterations`
        reached, or no improvement by a share `pretrain_min_delta` in `pretrain_patience` iterations."""
        c = config.critic
        self.iterations += 1
        improved = self.iterations == 1 or loss < self.best * (1 - c.pretrain_min_delta)
        if improved:  # the first iteration sets the baseline (inf * 0 would be NaN for min_delta 1)
            self.best, self.stale = loss, 0
        else:
            self.stale += 1
        return self.iterations >= c.pretrain_iterations or self.stale >= c.pretrain_patience

    def state_dict(self) -> dict[str, float | None]:
        return {"iterations": self.iterations, "best": self.best if math.isfinite(self.best) else None,
                "stale": self.stale}  # fmt: skip

    @classmethod
    def of(cls, state: dict[str, Any]) -> PretrainState:
        best = state["best"]
        return cls(int(state["iterations"]), math.inf if best is None else float(best), int(state["stale"]))
