"""The reference model: the frozen SFT policy whose log-probs anchor the KL penalty.

Two ways to hold it (memory: docs/algorithms.md §25, point 4):
- "copy": a deep copy of the policy, frozen (requires_grad False) and in eval mode;
- "adapter": when the policy is LoRA (PEFT), the policy's own weights with the adapter disabled
  (`with policy.disable_adapter():`): the base weights are frozen by PEFT, so they *are* the SFT
  model, and no second copy is allocated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn

from rlhf.models.backbone import eval_mode, is_peft_model
from rlhf.models.logprobs import response_logprobs

ReferenceMode = Literal["auto", "copy", "adapter"]


class ReferenceModel:
    """Frozen reference log-probs. Not an nn.Module on purpose: an optimizer built from the
    trainer's modules can never pick up its parameters.

    mode "auto" picks "adapter" for a PEFT policy and "copy" otherwise.
    """

    def __init__(self, policy: nn.Module, mode: ReferenceMode = "auto") -> None:
        if mode == "auto":
            mode = "adapter" if is_peft_model(policy) else "copy"
        if mode == "adapter":
            if not is_peft_model(policy):
                raise ValueError(
                    f"mode='adapter' needs a LoRA (PEFT) policy, got {type(policy).__name__}. Fix: use "
                    "mode='copy', or wrap the policy with rlhf.models.lora.apply_lora first."
                )
            self.model = policy
        elif mode == "copy":
            self.model = copy.deepcopy(policy).eval()
            self.model.requires_grad_(False)
        else:
            raise ValueError(f"mode must be 'auto', 'copy' or 'adapter', got {mode!r}.")
        self.mode: str = mode

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_length: int,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Reference log-probs [B, T] of the response tokens (0 at padding), without gradient."""
        with self.session() as logprobs:
            return logprobs(input_ids, attention_mask, prompt_length, temperature)

    @contextmanager
    def session(self) -> Iterator[Callable[..., torch.Tensor]]:
        """The reference's weights in force for a block: eval mode and, in mode "adapter", the
        adapter disabled, set once on entry and restored on exit. Yields `logprobs(input_ids,
        attention_mask, prompt_length, temperature=1.0)`, which several threads may call at once
        inside the block (switching the adapter per call would race between threads)."""

        def logprobs(
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            prompt_length: int,
            temperature: float = 1.0,
        ) -> torch.Tensor:
            with torch.no_grad():  # per thread
                return response_logprobs(self.model, input_ids, attention_mask, prompt_length, temperature)[0]

        with self.in_force():
            yield logprobs

    @contextmanager
    def in_force(self) -> Iterator[nn.Module]:
        """The module with the reference's weights in force for a block (no gradient, eval mode, a
        LoRA policy's adapter disabled): for forwards other than response log-probs, e.g. DPO's
        summed sequence log-probs."""
        with torch.no_grad(), eval_mode(self.model):
            if self.mode == "adapter":
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
