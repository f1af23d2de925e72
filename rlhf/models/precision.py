"""Numerical precision of a run: which dtype the weights are stored in and forwards compute in.

- "float32": everything in float32 (the CPU default);
- "bfloat16": float32 master weights, gradients and AdamW state; forwards under bf16 autocast
  (products in bf16, norms, softmaxes and losses in float32). The usual choice on a GPU;
- "bfloat16-pure": weights, gradients and AdamW state in bf16 (updates under 1/256 of a weight lost);
- "auto": "bfloat16" on a CUDA device that supports it, else "float32".
Whatever the policy, log-probs and losses reduce in float32, and a model's `float32_modules` (the
scalar head) keep float32 weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from rlhf.config import ConfigError

PRECISIONS = ("auto", "float32", "bfloat16", "bfloat16-pure")


def bfloat16_supported(device: torch.device) -> bool:
    """bfloat16 kernels exist on every CPU; on CUDA from compute capability 8.0 (Ampere) on."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True


@dataclass(frozen=True)
class Precision:
    """A resolved policy ("float32", "bfloat16" or "bfloat16-pure") on `device`."""

    name: str
    device: torch.device

    @classmethod
    def resolve(cls, name: str, device: torch.device, *, key: str = "dtype") -> Precision:
        """The policy named `name` on `device` ("auto" picked here); `ConfigError` naming `key` when
        `name` is unknown or the device has no bfloat16 support."""
        device = torch.device(device)
        if name not in PRECISIONS:
            raise ConfigError(
                f"{key} must be one of {', '.join(PRECISIONS)}, got {name!r}. Fix: set {key} to auto."
            )
        if name == "auto":
            name = "bfloat16" if device.type == "cuda" and bfloat16_supported(device) else "float32"
        if name != "float32" and not bfloat16_supported(device):
            raise ConfigError(
                f"{key} is {name!r} but {device} has no bfloat16 support (CUDA compute capability < 8.0). "
                f"Fix: set {key} to float32."
            )
        return cls(name, device)

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype trainable weights are stored in."""
        return torch.bfloat16 if self.name == "bfloat16-pure" else torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the matrix products in a forward."""
        return torch.float32 if self.name == "float32" else torch.bfloat16

    @property
    def uses_autocast(self) -> bool:
        return self.name == "bfloat16"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context forwards run in: bfloat16 autocast for "bfloat16", else nothing."""
        if not self.uses_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def prepare(self, model: nn.Module, device: torch.device | None = None) -> nn.Module:
        """Move `model` to `device` (default: this policy's) and cast its floating-point weights to
        `param_dtype` (its `float32_modules` stay float32), in place; returns `model`. Buffers keep
        their dtype (rotary frequencies stay float32)."""
        model.to(self.device if device is None else device)
        cast_parameters(model, self.param_dtype)
        return model


def _float32_parameter_ids(model: nn.Module) -> set[int]:
    """The parameters of every module listed in some submodule's `float32_modules`."""
    keep: set[int] = set()
    for module in model.modules():
        for name in getattr(module, "float32_modules", ()):
            keep.update(id(p) for p in getattr(module, name).parameters())
    return keep


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast the floating-point parameters of `model` to `dtype` in place (the Parameter objects stay
    the same, so optimizers built on them still hold them); `float32_modules` are left float32."""
    keep = _float32_parameter_ids(model)
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_floating_point():
                continue
            target = torch.float32 if id(param) in keep else dtype
            if param.dtype != target:
                param.data = param.data.to(target)
                if param.grad is not None:
                    param.grad = param.grad.to(target)
    return model
