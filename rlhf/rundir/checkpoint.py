"""Checkpoints: atomic, safetensors + JSON, never pickle.

`save_state` splits a training state (nested dicts, lists, numbers, strings and tensors) into one
safetensors file holding every tensor and one JSON skeleton that refers to them by name;
`load_state` puts it back together. A checkpoint is written under a temporary name and renamed into
place. Its `DONE` file, written last, records the iteration and every file's size and sha256
(`write_done`); `verify` checks them on load, and `latest_verified` falls back to the previous
checkpoint when one was damaged after it was written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rlhf.models.files import is_model_file
from rlhf.rundir.termination import finish_first

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


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yields a temporary sibling directory, renamed to `final` when the body returns. A Ctrl-C or
    SIGTERM meanwhile waits until the rename is done (`finish_first`): a due checkpoint is kept."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with finish_first():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _complete_done(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)


DONE = "DONE"


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_done(directory: Path, iteration: int) -> None:
    """Write `DONE` into a finished checkpoint directory: the iteration plus each file's size and sha256.

    Call it last, inside `atomic_directory`, once every other file of the checkpoint is written.
    """
    directory = Path(directory)
    files = {
        str(f.relative_to(directory)): {"size": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f.name != DONE
    }
    (directory / DONE).write_text(json.dumps({"iteration": int(iteration), "files": files}, indent=1))


def read_done(directory: Path) -> dict:
    """The record of `DONE`: `{"iteration": N, "files": {...}}`; an old-style DONE (the iteration as
    plain text) has no file list. Raises ValueError when DONE is missing or unreadable."""
    path = Path(directory) / DONE
    if not path.is_file():
        raise ValueError("no DONE file (the checkpoint was never finished)")
    text = path.read_text(errors="replace").strip()
    try:
        record = json.loads(text)
    except ValueError:
        raise ValueError(f"DONE is not readable ({text[:40]!r})") from None
    if isinstance(record, int) and not isinstance(record, bool):
        return {"iteration": record, "files": None}  # old style: the iteration number alone
    if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
        raise ValueError("DONE has no iteration")
    return {"iteration": record["iteration"], "files": record.get("files")}


def verify(path: Path) -> str | None:
    """None when the checkpoint at `path` is complete and unchanged, else what is wrong with it."""
    path = Path(path)
    try:
        record = read_done(path)
    except ValueError as err:
        return str(err)
    expected = _checkpoint_iteration(path)
    if expected is not None and record["iteration"] != expected:
        return f"DONE says iteration {record['iteration']}, the directory name says {expected}"
    for name, info in (record["files"] or {}).items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != info["size"]:
            return f"{name} has {size} bytes, {info['size']} were written"
        if sha256_file(f) != info["sha256"]:
            return f"{name} was changed after it was written (sha256 differs)"
    return None


def _checkpoint_iteration(path: Path) -> int | None:
    try:
        return int(Path(path).name.split("_", 1)[1])
    except (IndexError, ValueError):
        return None


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Every `checkpoints/iter_N` directory, complete or not, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_")]
    found = [p for p in found if _checkpoint_iteration(p) is not None]
    return sorted(found, key=_checkpoint_iteration)


def latest_verified(run_dir: Path, warn: Callable[[str], None]) -> Path | None:
    """The newest checkpoint of `run_dir` that `verify` passes; each newer damaged one is skipped
    with `warn(message naming it and what is wrong)`. None when no checkpoint is complete."""
    for path in reversed(_checkpoint_dirs(run_dir)):
        problem = verify(path)
        if problem is None:
            return path
        warn(f"skipping damaged checkpoint {path}: {problem}.")
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def clean_stale(run_dir: Path) -> list[Path]:
    """Remove what killed checkpoint writes left in `run_dir/checkpoints`: `.iter_*.tmp-PID` and
    `.iter_*.old-PID` directories of processes no longer alive, and empty `iter_*` directories.
    Returns the removed paths."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    removed = []
    for path in root.iterdir():
        if not path.is_dir():
            continue
        stale = False
        if path.name.startswith(".iter_") and (".tmp-" in path.name or ".old-" in path.name):
            pid = path.name.rsplit("-", 1)[-1]
            stale = pid.isdigit() and not _pid_alive(int(pid))
            final = root / path.name[1:].split(".", 1)[0]
            if stale and ".old-" in path.name and not final.exists():
                path.rename(final)  # killed between the two renames: the old copy is the only one
                continue
        elif path.name.startswith("iter_"):
            stale = not any(path.iterdir())
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _complete_done(directory: Path) -> None:
    """A checkpoint whose writer put an old-style DONE (the iteration alone) gets the full record."""
    try:
        record = read_done(directory)
    except ValueError:
        return  # no DONE: not a checkpoint (or not finished), nothing to record
    if record["files"] is None:
        write_done(directory, record["iteration"])


def set_aside_damaged(run_dir: Path, warn: Callable[[str], None]) -> Path | None:
    """Before a resume: rename each damaged checkpoint newer than the newest complete one to
    `checkpoints/damaged-iter_N` (kept for inspection, invisible to `list_checkpoints`), warning
    about each. Returns the newest complete checkpoint, or None."""
    good = latest_verified(run_dir, warn)
    floor = -1 if good is None else _checkpoint_iteration(good)
    for path in _checkpoint_dirs(run_dir):
        if _checkpoint_iteration(path) > floor:
            target = path.with_name(f"damaged-{path.name}")
            shutil.rmtree(target, ignore_errors=True)
            path.rename(target)
    return good


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


EXPORT_TMP = ".export.tmp-"  # an export being written; a killed one is thrown away
EXPORT_STAGED = ".export.staged-"  # a whole export being moved into place; a killed move is finished
EXPORT_OLD = ".export.old-"  # the files of the previous export, set aside until the new one is in place
EXPORT_MANIFEST = ".export-manifest.json"  # in a staged export: the entries it brings


@contextlib.contextmanager
def atomic_export(out: Path) -> Iterator[Path]:
    """Write a model export whole into a temporary directory in `out`, then put it in place.

    Yields the temporary directory `out/.export.tmp-PID` (beside the run's own files, on the same
    file system). Once the body returns, every file is synced and the directory is renamed to
    `.export.staged-PID` (one rename: the commit point, the new export is whole). Only then are the
    previous export's files set aside (config.json first) and the new ones renamed into `out`
    (config.json last), so `out` holds the previous export, or no loadable model for the moment of
    the moves, never a mix. A failed or killed write leaves the previous export untouched; what a
    killed export left is cleaned by the next export into `out` or the next run that locks it
    (`recover_exports`): a temporary directory is removed, a staged export is moved into place.
    The run's own files (metrics, config, checkpoints) are never touched.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recover_exports(out)
    tmp = out / f"{EXPORT_TMP}{os.getpid()}"
    with finish_first():  # a Ctrl-C or SIGTERM waits until the export is in place
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
            (tmp / EXPORT_MANIFEST).write_text(json.dumps(sorted(p.name for p in tmp.iterdir())))
            _fsync_tree(tmp)
            staged = out / f"{EXPORT_STAGED}{os.getpid()}"
            shutil.rmtree(staged, ignore_errors=True)
            os.rename(tmp, staged)  # the commit point
            _fsync_directory(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _install_export(out, staged)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for f in sorted(root.rglob("*")):
        if f.is_file():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        _fsync_directory(d)


def _is_export_entry(path: Path) -> bool:
    """A file or folder of a model export in a run directory: the model's files, or a sub-model's
    folder (`critic/`, holding a config.json)."""
    if path.name.startswith("."):
        return False
    if path.is_dir():
        return (path / "config.json").is_file()
    return is_model_file(path.name)


def _install_export(out: Path, staged: Path) -> None:
    """Move the staged export `staged` into `out`; run again after a kill, it finishes the job."""
    names = json.loads((staged / EXPORT_MANIFEST).read_text())
    pid = staged.name[len(EXPORT_STAGED) :]
    old = out / f"{EXPORT_OLD}{pid}"
    old.mkdir(exist_ok=True)
    previous = [
        p
        for p in out.iterdir()
        if _is_export_entry(p) and (p.name not in names or (staged / p.name).exists())  # not already new
    ]
    for p in sorted(previous, key=lambda p: p.name != "config.json"):  # config.json aside first
        aside = old / p.name
        if aside.is_dir():
            shutil.rmtree(aside)
        os.replace(p, aside)
    for name in sorted(names, key=lambda n: n == "config.json"):  # config.json in place last
        if (staged / name).exists():
            os.replace(staged / name, out / name)
    _fsync_directory(out)
    shutil.rmtree(staged, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def recover_exports(out: Path, *, owned: bool = False) -> list[str]:
    """Clean what killed exports left in `out`: finish moving a staged (whole) export into place,
    remove temporary directories and set-aside previous files. Only leftovers of dead processes are
    touched, or every one when `owned` (the caller holds the run directory's lock). Returns what was
    done, one line each."""
    out = Path(out)
    if not out.is_dir():
        return []
    done = []

    def stale(path: Path, prefix: str) -> bool:
        pid = path.name[len(prefix) :]
        return path.name.startswith(prefix) and pid.isdigit() and (owned or not _pid_alive(int(pid)))

    for path in sorted(out.iterdir()):
        if stale(path, EXPORT_STAGED):
            if (path / EXPORT_MANIFEST).is_file():
                _install_export(out, path)
                done.append(f"finished moving a killed export into {out}")
            else:
                shutil.rmtree(path, ignore_errors=True)
    for path in sorted(out.iterdir()):
        if stale(path, EXPORT_TMP) or stale(path, EXPORT_OLD):
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}, left by a killed export")
    return done
