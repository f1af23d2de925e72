"""Which device a run computes on, and moving models and batches there.

`resolve_device` turns the config's name ("auto", "cpu", "cuda", "cuda:N") into a `torch.device`;
`model_device` reads where a model lives; `to_device` moves a batch (a dict of tensors) there.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from rlhf.config import ConfigError

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(name: str, *, key: str = "train.device") -> torch.device:
    """The device named by `name`: "auto" (CUDA when available, else the CPU), "cpu", "cuda"
    (the current CUDA device) or "cuda:N". Raises `ConfigError` naming `key` and the fix for an
    unknown name or a CUDA device this machine does not have."""
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise ConfigError(
            f"{key} must be one of {', '.join(DEVICE_NAMES)}, got {name!r}. Fix: set {key} to auto or cpu."
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{key} is {name!r} but this machine has no usable CUDA device (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}). Fix: set {key} to cpu (or auto), or install "
            "a CUDA build of torch on a machine with an NVIDIA GPU."
        )
    index = match.group(1)
    if index is not None and int(index) >= torch.cuda.device_count():
        raise ConfigError(
            f"{key} is {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible "
            f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}). Fix: pick one of those, or cuda."
        )
    return torch.device(text)


def model_device(model: nn.Module) -> torch.device:
    """Where `model` computes: its first parameter's device (the CPU for a model without parameters);
    for a sharded parameter (a DTensor), its mesh's device, where FSDP gathers it (its shard may sit
    in CPU memory: `dist.offload`, rlhf/parallel/fsdp.py)."""
    param = next(model.parameters(), None)
    if param is None:
        return torch.device("cpu")
    mesh = getattr(param, "device_mesh", None)
    if mesh is not None and mesh.device_type != param.device.type:
        return torch.device(mesh.device_type)
    return param.device


def same_device(a: torch.device, b: torch.device) -> bool:
    """True when `a` and `b` name the same device ("cuda" and "cuda:0" alike on device 0)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def to_device(batch: dict, device: torch.device) -> dict:
    """`batch` with every tensor moved to `device` (other values kept); a copy, the input untouched."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
