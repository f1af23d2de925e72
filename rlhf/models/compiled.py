"""Compiled training forwards (`train.compile`, docs/speed.md "Compiled training forwards").

On a GPU the update of a small model is bound by the host: one optimizer step of SmolLM2-135M's
shape launched its forward and backward op by op, the device busy 12% of it (docs/speed.md, "On a
GPU"). `torch.compile` fuses those ops into far fewer kernels, as Hugging Face's `torch_compile`
and verl's `use_torch_compile` do.

A decoder marked here (`compile_for_training`) runs compiled in its forwards *with gradients on*
(`run_decoder`, rlhf/models/backbone.py: the one call of a decoder behind every loss): the training
passes of SFT, the reward model, DPO, the policy, the critic and the PPO-ptx term. Every forward
without gradients (the rollout's scoring, evaluation, a DPO reference) and the sampler (its own
engines, rlhf/models/decoding.py) run it as it is: their shapes change from call to call, and a
compile pays only over many calls of one kind. The mark is an attribute holding the backend's name,
so a copy made later keeps it (as packing's does) and no state dict changes. A pass's rows and
length are marked dynamic from the first call, so dynamo makes one graph per trained model (per
architecture and mode; one more for a pass of a single row), not one per shape.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from rlhf.models.backbone import COMPILE_ATTRIBUTE
from rlhf.models.packing import causal_lms  # the causal LMs inside a wrapper


def compile_refusal(backend: str, device: torch.device) -> str | None:
    """Why `backend` (a name torch.compile knows: the config checks it) cannot compile on `device`
    here (None: it can)."""
    if backend == "inductor" and device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "inductor compiles for a GPU with triton, which is not installed"
    return None


def compile_for_training(model: nn.Module, backend: str = "inductor") -> None:
    """Mark the decoder of every causal LM inside `model` (itself, a PEFT wrapper's, a scalar-head
    model's) so that its forwards with gradients on run compiled by `backend`."""
    for lm in causal_lms(model):
        decoder = lm.get_decoder()
        setattr(decoder, COMPILE_ATTRIBUTE, backend)


def is_compiled_for_training(model: nn.Module) -> bool:
    """True when a decoder inside `model` is marked by `compile_for_training`."""
    return any(getattr(m, COMPILE_ATTRIBUTE, None) is not None for m in model.modules())
