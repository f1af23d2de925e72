"""Mask handling shared by every core function.

The rule that keeps padding out of the math: the inputs are *filled* (``torch.where``) with 0 at
masked positions before any arithmetic. Multiplying by the mask is not enough: ``NaN * 0`` and
``inf * 0`` are NaN, and even when the forward value is masked out by ``torch.where`` afterwards, the
backward pass multiplies a zero gradient by a NaN derivative. Filling first makes outputs *and*
gradients independent of whatever sits at padded positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor, like: Tensor, *, name: str = "x") -> Tensor:
    """Check that `mask` has the shape of `like` and return it as a bool tensor (nonzero = valid)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor (0/1 or bool), got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but {name} has shape {tuple(like.shape)}: "
            "pass a 0/1 mask of exactly the same shape (response tokens [B, T], right-padded)"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def fill_masked(x: Tensor, valid: Tensor, value: float = 0.0) -> Tensor:
    """`x` where `valid`, `value` elsewhere; gradients at the filled positions are exactly 0."""
    return torch.where(valid, x, torch.as_tensor(value, dtype=x.dtype, device=x.device))


def check_same_shape(reference: Tensor, name_ref: str, **tensors: Tensor | None) -> None:
    """Raise a ValueError naming the first tensor whose shape differs from `reference`."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {name_ref} has shape "
                f"{tuple(reference.shape)}: every per-token tensor must be [B, T] like the mask"
            )
