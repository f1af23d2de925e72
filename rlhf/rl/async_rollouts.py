"""Asynchronous rollouts (`rollout.max_staleness` K > 0; docs/algorithms.md §34): the rollout actors
sample the next K batches while the policy updates, and the loop trains on them in order, each at
most K policy versions behind (the decoupled PPO weights of make_experience correct for it)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rlhf.models.sampling import Rollout
from rlhf.rl.dapo import Scored
from rlhf.rl.rollout_source import SampledRollouts
from rlhf.runtime.protocol import Ready, RolloutHandle


@dataclass
class PendingRollout:
    """A rollout submitted to the runtime: its prompts' group ids and rows of the prompt file, the
    handle whose `result()` is the Rollout, the policy version that samples it."""

    group: torch.Tensor
    indices: list[int]
    handle: RolloutHandle
    version: int


class AsyncRollouts(SampledRollouts):
    """SampledRollouts sampled ahead: `pending` holds the next K, in the order they are trained on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: list[PendingRollout] = []

    def next_batch(self, iteration: int) -> Scored:
        """The oldest pending rollout (one is submitted first when none is)."""
        started = time.perf_counter()
        if not self.pending:
            self.pending.append(self.submit())
        pending = self.pending.pop(0)
        rollout = pending.handle.result()
        behind = self.runtime.policy_version - pending.version
        return self.score(pending.group, pending.indices, rollout, iteration, started, behind)

    def submit(self) -> PendingRollout:
        """The next rollout, sampled by the rollout actors while this process goes on."""
        prompts, group, indices = self.draw_prompts()
        handle = self.runtime.submit_generate(prompts, True)  # the behaviour log-probs with it
        return PendingRollout(group, indices, handle, self.runtime.policy_version)

    def sample_ahead(self, iteration: int) -> None:
        """Up to K rollouts sampled ahead (none past the last iteration). The one submitted during
        update u is sampled by the policy of version u (the rollout actors run their calls in order:
        the weights of every earlier update first) and trained on at iteration u + (its place in the
        queue) <= u + K: at most K versions behind (§34)."""
        left = self.config.train.iterations - iteration - 1
        while len(self.pending) < min(self.config.rollout.max_staleness, left):
            self.pending.append(self.submit())

    def state(self) -> dict[str, Any]:
        """The rollouts sampled ahead, waited for, in their order: a resumed run trains on them as the
        uninterrupted one does, each as many versions behind."""
        states = []
        for i, p in enumerate(self.pending):
            rollout = p.handle.result()
            self.pending[i] = PendingRollout(p.group, p.indices, Ready(rollout), p.version)
            behind = self.runtime.policy_version - p.version
            states.append(
                {"group": p.group, "indices": p.indices, "rollout": asdict(rollout), "behind": behind}
            )
        return {"prompts": self.prompts.state_dict(), "pending": states}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        for p in state["pending"]:
            version = self.runtime.policy_version - p["behind"]
            self.pending.append(
                PendingRollout(p["group"], list(p["indices"]), Ready(Rollout(**p["rollout"])), version)
            )
