"""The critic role: V(s_t) for every response token, trained on the (clipped) value loss.

Two variants behind one interface (`values`, `train_step`):
- `Critic`: a separate network (PPO paper §5.3.3: initialized from the reward model, or the
  SFT trunk with a zero head), with its own optimizer;
- `SharedCritic`: a value head on the policy's own trunk (`model.critic_mode shared`); its loss
  joins the policy's optimizer step, so it trains on its own only in critic pre-training, where
  the trunk stays frozen and only the head learns.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.parallel.parallel_plan import ParallelPlan
from rlhf.rl.experience import Experience, scored_in_chunks, valid_tokens
from rlhf.rl.roles.forward import ValueForward
from rlhf.rl.roles.policy import Policy, value_micro_loss
from rlhf.train.learner import Learner, MicroBatch, StepStats, step_metrics


class ValueRole:
    """What both critics share: values in row chunks (`forward`, `micro_batch_size`, `by_length`,
    `micro_batch_tokens`) and the optimizer step of the value loss, a token mean."""

    prefix = "value"
    forward: Callable[[Sequences], torch.Tensor]
    micro_batch_size: int
    by_length: bool
    micro_batch_tokens: int | None
    runs_through: nn.Module  # the module its forwards run through (what FSDP2 shards)

    @torch.no_grad()
    def values(self, sequences: Sequences) -> torch.Tensor:
        """V [B, T] of every response token (0 at padding)."""
        return scored_in_chunks(self.forward, sequences, self, self.runs_through)

    def loss_denominator(self, minibatch: Experience) -> float:
        return minibatch.num_tokens  # the value loss is a token mean

    @staticmethod
    def value_step(
        learner: Learner,
        minibatch: Experience,
        total_tokens: float | None,
        forward: Callable[[Sequences], torch.Tensor],
        value_clip: float | None,
        coef: float | None = None,
        before_update: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """One optimizer step of `learner` on the (clipped) value loss of `forward`, times `coef`."""
        stats = StepStats()

        def loss(micro: MicroBatch) -> tuple[torch.Tensor, dict[str, Any]]:
            value = value_micro_loss(forward, micro.rows, value_clip, stats, micro.weight)
            scale = micro.weight if coef is None else micro.weight * coef
            return scale * value, {}

        total = minibatch.num_tokens if total_tokens is None else total_tokens
        _, grad_norm = learner.step(minibatch, [loss], valid_tokens, total, before_update=before_update)
        return {**stats.result(learner.peers), **step_metrics("value", grad_norm)}


class Critic(ValueRole, Learner):
    shares_policy = False  # a network and an optimizer of its own

    def __init__(
        self,
        model: ScalarHeadModel,
        *,
        value_clip: float | None,
        optim: OptimConfig,
        total_steps: int,
        micro_batch_size: int,
        precision: Precision | None = None,
        sort_by_length: bool = True,
        micro_batch_tokens: int | None = None,
        packing: bool = False,
        parallel: ParallelPlan | None = None,
    ) -> None:
        self.model = model
        self.value_clip = value_clip
        self.forward = ValueForward(model, precision)
        self.runs_through = self.forward
        super().__init__(
            self.forward, optim, total_steps, micro_batch_size=micro_batch_size, by_length=sort_by_length,
            micro_batch_tokens=micro_batch_tokens, packing=packing,
            **(parallel.learner_options() if parallel else {}),
        )  # fmt: skip

    def train_step(self, minibatch: Experience, total_tokens: float | None = None) -> dict[str, float]:
        """One optimizer step of the value loss on `minibatch` (rlhf/train/learner.py `Learner.step`)."""
        return self.value_step(self, minibatch, total_tokens, self.train_forward, self.value_clip)


class SharedCritic(ValueRole):
    """The value head on the policy's trunk; the policy's optimizer steps it."""

    shares_policy = True

    def __init__(self, policy: Policy) -> None:
        if policy.joint_value is None:
            raise ValueError("SharedCritic needs a policy built with joint_value (its value head).")
        self.policy = policy
        self.joint = policy.joint_value
        self.model: ScalarHeadModel = self.joint.forward.model
        self.forward = partial(policy.module, part="value")  # through the policy's module (fsdp2 gathers it)
        self.runs_through = policy.module
        self.micro_batch_size = policy.micro_batch_size
        self.by_length = policy.by_length
        self.micro_batch_tokens = policy.micro_batch_tokens

    def train_step(self, minibatch: Experience, total_tokens: float | None = None) -> dict[str, float]:
        """Critic pre-training (PPO paper §5.3.3): the value loss alone, in the policy's optimizer step;
        the trunk stays as it is, only the value head's gradients are kept."""
        values = partial(self.policy.train_forward, part="value")  # a training pass (ddp: through DDP)

        def head_only() -> None:
            head = {id(q) for q in self.model.head.parameters()}
            for q in self.policy.module.parameters():  # under fsdp2: the shards, with their reduced gradients
                if id(q) not in head:
                    q.grad = None

        j = self.joint
        return self.value_step(self.policy, minibatch, total_tokens, values, j.value_clip, j.coef, head_only)
