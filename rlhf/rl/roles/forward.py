"""Each trained role's forward as one `nn.Module.forward`.

This library calls a Hugging Face causal LM as decoder + output head (models/backbone.py), so the
output head runs only on the columns a loss needs. A wrapper that hooks `forward` (DDP's gradient
synchronization, FSDP2's parameter gathering) must see every parameter a loss touches go through
one call of the module it wraps: these thin modules are that call. Each runs under its role's
precision (bf16 autocast, or nothing) and lets checkpointed decoder layers recompute in the
backward although the role stays in eval mode (no dropout).
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
from torch import nn

from rlhf.models.grad_checkpointing import checkpointing_in_eval
from rlhf.models.logprobs import response_logprobs
from rlhf.models.precision import Precision
from rlhf.models.sampling import Rollout, SamplingConfig, generate
from rlhf.models.scalar_head import ScalarHeadModel, response_values
from rlhf.models.sequences import Sequences
from rlhf.train.lm_loss import model_token_nll


class PolicyForward(nn.Module):
    """`forward(sequences, temperature, with_entropy, entropy_grad)` -> (log-probs [B, T], entropies
    [B, T] or None) of the response tokens; `forward(lm_batch=...)` -> (summed next-token NLL, token
    count) of a right-padded SFT batch (the PPO-ptx term)."""

    def __init__(self, model: nn.Module, precision: Precision | None = None) -> None:
        super().__init__()
        self.model = model
        self.precision = precision

    def forward(
        self,
        sequences: Sequences | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        lm_batch: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[torch.Tensor, int]:
        with autocast(self.precision), checkpointing_in_eval(self.model):
            if lm_batch is not None:
                return model_token_nll(
                    self.model, lm_batch["input_ids"], lm_batch["attention_mask"], lm_batch["loss_mask"]
                )
            assert sequences is not None  # a policy forward takes `sequences`, a ptx one `lm_batch`
            return response_logprobs(
                self.model,
                sequences.input_ids,
                sequences.attention_mask,
                sequences.prompt_length,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
            )

    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingConfig, **options: Any
    ) -> Rollout:
        """The rollout of a left-padded prompt batch (rlhf.models.sampling.generate with `options`),
        as a forward method: a sharded policy gathers its parameters for it (rlhf/parallel/fsdp.py)."""
        with autocast(self.precision):
            return generate(self.model, input_ids, attention_mask, sampling, **options)


class ValueForward(nn.Module):
    """`forward(sequences)` -> V(s_t) [B, T] for each response token (0 at padding)."""

    def __init__(self, model: ScalarHeadModel, precision: Precision | None = None) -> None:
        super().__init__()
        self.model = model
        self.precision = precision

    def forward(self, sequences: Sequences) -> torch.Tensor:
        with autocast(self.precision), checkpointing_in_eval(self.model):
            return response_values(
                self.model, sequences.input_ids, sequences.attention_mask, sequences.prompt_length
            )


def autocast(precision: Precision | None) -> contextlib.AbstractContextManager[Any]:
    """The precision's autocast context (bf16), or nothing."""
    return precision.autocast() if precision is not None else contextlib.nullcontext()


class JointForward(nn.ModuleList):
    """The policy's forward and a value head on its trunk (`model.critic_mode shared`) as one module:
    the unit a sharded policy gathers (the two share the trunk). `forward(..., part="value")` is the
    value forward, any other call the policy's; its parameter names are a ModuleList's ("0.", "1.")."""

    def __init__(self, policy: PolicyForward, value: ValueForward) -> None:
        super().__init__([policy, value])

    def forward(self, *args: Any, part: str = "policy", **kwargs: Any) -> Any:
        return self[1 if part == "value" else 0](*args, **kwargs)

    def sample(self, *args: Any, **kwargs: Any) -> Rollout:
        return cast(PolicyForward, self[0]).sample(*args, **kwargs)
