"""What a checkpoint stores of a model: the parameters that train, never the frozen ones.

A LoRA policy trains its adapters only; its frozen base is the SFT model, which a resumed run
loads again from `model.policy`. Storing the whole model in every checkpoint (540 MB for a 135M
model in float32) kept a copy of weights that never change. `save_trained` writes
`NAME.trained.safetensors`: every parameter with `requires_grad` (LoRA adapters, a value head, or
all of a fully trained model), with a fingerprint of the frozen ones in its metadata, so that a
resume on other base weights stops with a message instead of training on a model that never was.
The optimizer's state already covers the trained parameters only (rlhf.train.optimizer).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from rlhf.config import ConfigError

FORMAT = "trained-parameters-v1"


def trained_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: parameter} of every parameter of `model` that trains (tied ones once)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def frozen_fingerprint(model: nn.Module) -> str:
    """sha256 over the names, dtypes, shapes and bytes of the frozen parameters ("" when none)."""
    frozen = [(name, p) for name, p in model.named_parameters() if not p.requires_grad]
    if not frozen:
        return ""
    digest = hashlib.sha256()
    for name, p in frozen:
        data = p.detach().cpu().contiguous()
        digest.update(f"{name}|{data.dtype}|{tuple(data.shape)}\n".encode())
        if data.numel():
            digest.update(data.reshape(-1).view(torch.uint8).numpy())  # the tensor's own buffer: no copy
    return digest.hexdigest()


def trained_file(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.trained.safetensors"


def save_trained(model: nn.Module, directory: Path, name: str) -> Path:
    """Write the trained parameters of `model` to `directory/NAME.trained.safetensors`."""
    tensors = {key: p.detach().cpu().contiguous() for key, p in trained_parameters(model).items()}
    path = trained_file(directory, name)
    save_file(tensors, str(path), metadata={"format": FORMAT, "frozen_sha256": frozen_fingerprint(model)})
    return path


def load_trained(model: nn.Module, directory: Path, name: str) -> None:
    """Restore `model`'s trained parameters from a checkpoint. Raises ConfigError when the checkpoint
    has none for it or does not fit the model (other trained parameters, or other frozen base weights)."""
    directory = Path(directory)
    path = trained_file(directory, name)
    if not path.is_file():
        raise ConfigError(
            f"{path} is missing: {directory} holds no trained parameters of the {name}. Fix: resume from "
            "a checkpoint this version wrote (checkpoints/iter_*/ with DONE), or start a new run."
        )
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        stored = {key: f.get_tensor(key) for key in f.keys()}
    params = trained_parameters(model)
    if set(stored) != set(params):
        missing, extra = sorted(set(params) - set(stored)), sorted(set(stored) - set(params))
        raise ConfigError(
            f"{path}: the checkpoint's trained parameters do not match the model's (missing {missing[:3]}, "
            f"unexpected {extra[:3]}). Fix: resume with the run's own config.yaml (the same LoRA settings)."
        )
    if metadata.get("frozen_sha256", "") != frozen_fingerprint(model):
        raise ConfigError(
            f"{path}: the model's frozen weights differ from those the checkpoint was trained on (the "
            "checkpoint holds the trained parameters only). Fix: resume with the same base model (the "
            "run's config.yaml, model.policy / model.reward_model) that the run started from."
        )
    with torch.no_grad():
        for key, p in params.items():
            value = stored[key]
            if value.shape != p.shape:
                raise ConfigError(
                    f"{path}: {key} has shape {tuple(value.shape)}, the model's is {tuple(p.shape)}. Fix: "
                    "resume with the run's own config.yaml."
                )
            p.copy_(value)
