"""Checkpoints: atomic, safetensors + JSON, never pickle.

A training state is a nested structure of dicts, lists, numbers, strings and tensors (optimizer
and scheduler `state_dict()`s, RNG states, counters). `save_state` splits it into one
safetensors file holding every tensor and one JSON skeleton that refers to them by name;
`load_state` puts it back together. A checkpoint directory is written under a temporary name
and renamed into place, so an interrupted save never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_TENSOR = "__tensor__"
_TUPLE = "__tuple__"
_INTKEYS = "__intkeys__"


def _split(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        name = path or "root"
        tensors[name] = obj.detach().cpu().contiguous()
        return {_TENSOR: name}
    if isinstance(obj, dict):
        int_keys = bool(obj) and all(isinstance(k, int) for k in obj)
        if not int_keys and not all(isinstance(k, str) for k in obj):
            raise TypeError(f"checkpoint state at {path!r}: dict keys must be all str or all int")
        body = {str(k): _split(v, tensors, f"{path}.{k}") for k, v in obj.items()}
        return {_INTKEYS: body} if int_keys else body
    if isinstance(obj, tuple):
        return {_TUPLE: [_split(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_split(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint state at {path!r}: cannot store {type(obj).__name__} without pickle")


def _join(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if _TENSOR in obj:
            return tensors[obj[_TENSOR]]
        if _TUPLE in obj:
            return tuple(_join(v, tensors) for v in obj[_TUPLE])
        if _INTKEYS in obj:
            return {int(k): _join(v, tensors) for k, v in obj[_INTKEYS].items()}
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def save_state(state: dict, directory: Path, name: str) -> None:
    """Write `name.json` + `name.safetensors` into `directory` (which the caller renames atomically)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(state, tensors, "")
    save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(skeleton))


def load_state(directory: Path, name: str) -> dict:
    tensors = load_file(str(directory / f"{name}.safetensors"))
    return _join(json.loads((directory / f"{name}.json").read_text()), tensors)


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    """Every random number generator the training loop draws from: Python's, NumPy's, torch's CPU
    one, each CUDA device's default one when CUDA is in use, and the named `generators` (on any
    device; their states are CPU tensors)."""
    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "torch": torch.get_rng_state(),
        "generators": {k: g.get_state() for k, g in (generators or {}).items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()  # one per visible device
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # the devices both runs see (usually all)
        for index, saved in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(saved, index)
    for k, g in (generators or {}).items():
        g.set_state(state["generators"][k])


def atomic_directory(final: Path):
    """Context manager: yields a temporary sibling directory, renamed to `final` on success."""
    return _AtomicDirectory(Path(final))


class _AtomicDirectory:
    def __init__(self, final: Path):
        self.final = final
        self.tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")

    def __enter__(self) -> Path:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        for f in self.tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
        old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
        if self.final.exists():
            self.final.rename(old)
        self.tmp.rename(self.final)
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (`checkpoints/iter_000010`)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_") and (p / "DONE").exists()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
