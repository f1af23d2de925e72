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

from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.rl.experience import Experience, scored_in_chunks, valid_tokens
from rlhf.rl.roles.forward import ValueForward
from rlhf.rl.roles.policy import Policy, value_micro_loss
from rlhf.train.learner import Learner, Training
from rlhf.train.micro_batches import MicroBatch
from rlhf.train.optimizer import step_metrics
from rlhf.train.step_stats import StepStats


class ValueRole:
    """What both critics share: values in row chunks (`forward`, cut as its learner's micro-batches)
    and the optimizer step of the value loss, a token mean (`value_step`)."""

    prefix = "value"
    forward: Callable[[Sequences], torch.Tensor]
    learner: Learner  # what trains it (a shared critic's: the policy's)
    runs_through: nn.Module  # the module its forwards run through (what FSDP2 shards)

    @torch.no_grad()
    def values(self, sequences: Sequences) -> torch.Tensor:
        """V [B, T] of every response token (0 at padding)."""
        return scored_in_chunks(self.forward, sequences, self.learner.batching, self.runs_through)

    def loss_denominator(self, minibatch: Experience) -> float:
        return minibatch.num_tokens  # the value loss is a token mean


def value_step(
    learner: Learner,
    minibatch: Experience,
    total_tokens: float | None,
    forward: Callable[[Sequences], torch.Tensor],
    value_clip: float | None,
    coef: float | None = None,
    head: nn.Module | None = None,
) -> dict[str, float]:
    """One optimizer step of `learner` on the (clipped) value loss of `forward`, times `coef`; with
    `head`, the gradients of its parameters alone are kept (the rest of the module stays as it is)."""
    stats = StepStats()

    def loss(micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        value = value_micro_loss(forward, micro.rows, value_clip, stats, micro.weight)
        scale = micro.weight if coef is None else micro.weight * coef
        return scale * value, {}

    total = minibatch.num_tokens if total_tokens is None else total_tokens
    learner.accumulate(minibatch, loss, valid_tokens, total)
    if head is not None:
        kept = {id(q) for q in head.parameters()}
        for q in learner.module.parameters():  # under fsdp2: the shards, with their reduced gradients
            if id(q) not in kept:
                q.grad = None
    grad_norm = learner.optimizer_step()
    return {**stats.result(learner.peers), **step_metrics("value", grad_norm)}


class Critic(ValueRole):
    """A value network of its own (`model`) and its `learner`, trained on the value loss clipped by
    `value_clip` (None: unclipped)."""

    shares_policy = False  # a network and an optimizer of its own

    def __init__(
        self,
        model: ScalarHeadModel,
        *,
        value_clip: float | None,
        training: Training,
        precision: Precision | None = None,
    ) -> None:
        self.model = model
        self.value_clip = value_clip
        self.forward = ValueForward(model, precision)
        self.runs_through = self.forward
        self.learner = Learner.build(self.forward, training)

    def train_step(self, minibatch: Experience, total_tokens: float | None = None) -> dict[str, float]:
        """One optimizer step of the value loss on `minibatch` (`value_step`)."""
        return value_step(self.learner, minibatch, total_tokens, self.learner.train_forward, self.value_clip)

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)


class SharedCritic(ValueRole):
    """The value head on the policy's trunk; the policy's learner trains it."""

    shares_policy = True

    def __init__(self, policy: Policy) -> None:
        if policy.joint_value is None:
            raise ValueError("SharedCritic needs a policy built with joint_value (its value head).")
        self.policy = policy
        self.joint = policy.joint_value
        self.model: ScalarHeadModel = self.joint.forward.model
        self.learner = policy.learner
        # through the policy's module (fsdp2 gathers it)
        self.forward = partial(policy.learner.module, part="value")
        self.runs_through = policy.learner.module

    def train_step(self, minibatch: Experience, total_tokens: float | None = None) -> dict[str, float]:
        """Critic pre-training (PPO paper §5.3.3): the value loss alone, in the policy's optimizer step;
        the trunk stays as it is, only the value head's gradients are kept."""
        values = partial(self.learner.train_forward, part="value")  # a training pass (ddp: through DDP)
        j = self.joint
        return value_step(
            self.learner, minibatch, total_tokens, values, j.value_clip, j.coef, self.model.head
        )
