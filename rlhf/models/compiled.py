"""Compiled training forwards (`train.compile`, docs/speed.md "Compiled training forwards").

A decoder marked here (`compile_for_training`) runs compiled by `torch.compile` in its forwards with
gradients on (`run_decoder`, rlhf/models/backbone.py: SFT, reward model, DPO, policy, critic, PPO-ptx);
no-grad forwards and the sampler run it as it is (their shapes change from call to call). The mark is
an attribute holding the backend's name, so copies keep it and no state dict changes. A pass's rows
and length are marked dynamic from the first call: one graph per trained model, not per shape.
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
