"""Run directories: the metrics logger of a fresh or resumed run, and quiet Hugging Face saves.

A run directory holds the records of one run. Starting a fresh run into a directory that already
has metrics stops before anything is written, with the fix in the message: nothing of the earlier
run is lost.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlhf.config import ConfigError
from rlhf.monitor import MetricsLogger
from rlhf.monitor.logger import METRICS_FILE


def _existing_run_error(run_dir: str | Path, resumable: bool) -> ConfigError:
    fix = f"use --resume {run_dir} or another --out" if resumable else "use another --out (or delete it)"
    return ConfigError(f"run directory {run_dir} already has {METRICS_FILE}: {fix}.")


def check_fresh_run_dir(run_dir: str | Path, *, resumable: bool) -> None:
    """Raise ConfigError if `run_dir` already holds the metrics of a run (call before writing to it).

    `resumable`: the stage can continue a run (`rlhf train --resume`), so the fix offers it.
    """
    metrics = Path(run_dir) / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        raise _existing_run_error(run_dir, resumable)


def open_metrics_logger(
    run_dir: str | Path, *, resumable: bool, writer: bool = True, **kwargs
) -> MetricsLogger | SilentLogger:
    """`MetricsLogger(run_dir, **kwargs)`, with the ConfigError of `check_fresh_run_dir` instead of
    the logger's FileExistsError for a fresh run into a used directory; a `SilentLogger` on a process
    that is not the run's `writer` (ranks other than 0)."""
    if not writer:
        return SilentLogger()
    try:
        return MetricsLogger(run_dir, **kwargs)
    except FileExistsError:
        raise _existing_run_error(run_dir, resumable) from None


class SilentLogger:
    """The logger of a rank that writes nothing: rank 0's logger records the same metrics."""

    last_step = None

    def log(self, step: int, metrics: dict, kind: str = "iteration", *, done: int | None = None) -> dict:
        return {kind: step, **metrics}

    def warn(
        self, message: str, step: int | None = None, kind: str | None = None, code: str | None = None
    ) -> dict:
        return {"event": "warning", "message": str(message)}

    def log_samples(self, step: int, rows, kind: str = "iteration") -> None:
        pass

    def status(self, what: str, done: int, kind: str = "iteration") -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> SilentLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


@contextlib.contextmanager
def quiet_hf_saves() -> Iterator[None]:
    """Hide transformers' "Writing model shards" progress bars around `save_pretrained` calls."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def check_writable_dir(out: str | Path) -> None:
    """Raise ConfigError, before any work, when the directory `--out` names cannot be made or written:
    under a file, on a read-only file system, without permission, a name too long. Tried for real:
    each missing folder is made and a file written in the deepest, then all of it removed again."""
    target = Path(out)
    existing, missing = target, []
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"--out {out} is under {existing}, which is not a folder. Fix: --out a directory of its own "
            "(e.g. runs/NAME)."
        )
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(out) else ""
        raise ConfigError(
            f"--out {out} cannot be written: {err.strerror or err}{where}. Fix: --out a directory you may "
            "write, on a writable disk (e.g. runs/NAME)."
        ) from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def check_out_dir(out: str | Path, inputs: dict[str, str | None]) -> None:
    """Refuse, before any work, an `--out` a run must not write: an existing file, or one of the
    model directories the run reads (`inputs`: flag -> path) or a folder inside one, where the export
    would overwrite that model. A path that names no local directory (a hub id) is not compared."""
    from rlhf.rundir.out_path import classify_out

    target = Path(out)
    found = classify_out(out, "")
    if found.kind == "dangling_link":
        raise ConfigError(
            f"--out {out} is a symbolic link to {found.target}, which does not exist. Fix: create "
            f"{found.target} (mkdir -p {found.target}), or --out a new directory (e.g. runs/NAME)."
        )
    if found.kind == "file":
        raise ConfigError(
            f"--out {out} is an existing file, not a directory: the run would replace it. "
            "Fix: --out a new directory (e.g. runs/NAME)."
        )
    check_writable_dir(out)
    resolved = target.resolve()
    for flag, path in inputs.items():
        if not path or not Path(path).is_dir():
            continue
        model = Path(path).resolve()
        if resolved == model or model in resolved.parents:
            where = "is" if resolved == model else "is inside"
            raise ConfigError(
                f"--out {out} {where} the {flag} directory {path}: the run's export would overwrite the "
                f"model it reads. Fix: --out a directory of its own (e.g. runs/NAME)."
            )
