"""Metric sinks: where `MetricsLogger` sends each record (jsonl file, TensorBoard, Weights & Biases).

The console sink lives in `console.py`. Every sink has the same three methods:

    log(step, kind, record)   record = {kind: step, "metric": value, ...} (values already JSON-safe)
    warn(record)              record = {"event": "warning", kind: step, "message": "..."}
    close()

TensorBoard and Weights & Biases are optional: they are imported only when asked for, and a
missing package stops early with the `pip install` line that fixes it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlhf.monitor.records import dumps_record, read_metrics, record_step, truncate_after


class MissingDependencyError(ImportError):
    """An optional sink was asked for but its package is not installed."""


@runtime_checkable
class Sink(Protocol):
    def log(self, step: int, kind: str, record: dict[str, Any]) -> None: ...

    def warn(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _numbers(record: dict[str, Any], kind: str) -> dict[str, float]:
    """The scalar numeric entries of a record, without its step key (None = NaN/inf is skipped)."""
    return {
        key: value
        for key, value in record.items()
        if key != kind and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class JsonlSink:
    """Appends one JSON object per line to `path`, flushed after every line.

    `resume=False`: the file must not hold earlier records unless `overwrite=True` (nothing written
    by an earlier run is lost by accident). `resume=True`: records are appended; with `resume_step`,
    the records of steps > resume_step (written after the checkpoint the run resumes from) are
    dropped first, so the resumed run writes no duplicate steps. An interrupted last line is dropped.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        resume: bool = False,
        resume_step: int | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(path)
        self.last_step: int | None = None  # the highest step already in the file (after truncation)
        has_records = self.path.exists() and self.path.stat().st_size > 0
        if has_records and not resume and not overwrite:
            raise FileExistsError(
                f"{self.path} already holds the metrics of an earlier run: pass resume=True "
                "(with resume_step=<checkpoint step>) to continue that run, overwrite=True to start over, "
                "or choose another run directory"
            )
        if has_records and resume:
            ends_cleanly = self.path.read_bytes().endswith(b"\n")
            if resume_step is not None or not ends_cleanly:
                truncate_after(self.path, resume_step if resume_step is not None else sys.maxsize)
            steps = [record_step(r) for r in read_metrics(self.path)]
            self.last_step = max((s for s in steps if s is not None), default=None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a" if resume else "w", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        self._handle.write(dumps_record(record) + "\n")
        self._handle.flush()

    def log(self, step: int, kind: str, record: dict[str, Any]) -> None:
        self._write(record)

    def warn(self, record: dict[str, Any]) -> None:
        self._write(record)

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()


class TensorBoardSink:
    """Scalars (and histograms of list values) to `log_dir` with `torch.utils.tensorboard.SummaryWriter`."""

    def __init__(self, log_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingDependencyError(
                "the 'tensorboard' sink needs the tensorboard package: pip install tensorboard "
                "(or pip install 'rlhf[tensorboard]'), or drop 'tensorboard' from the sinks"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))
        if config:
            text = json.dumps(config, indent=2, default=str, sort_keys=True)
            self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def log(self, step: int, kind: str, record: dict[str, Any]) -> None:
        for key, value in _numbers(record, kind).items():
            self.writer.add_scalar(key, value, step)
        for key, value in record.items():
            if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                import numpy as np

                self.writer.add_histogram(key, np.asarray(value, dtype=np.float64), step)

    def warn(self, record: dict[str, Any]) -> None:
        self.writer.add_text("warnings", str(record.get("message", "")), record_step(record) or 0)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases, offline unless told otherwise.

    The mode is `mode`, else the WANDB_MODE environment variable, else "offline" (runs are kept in
    `run_dir/wandb`; upload later with `wandb sync`). If an online start fails (no network, no login),
    the sink falls back to offline and says so on stderr. Warnings go to the run summary.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        project: str | None = None,
        mode: str | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError:
            raise MissingDependencyError(
                "the 'wandb' sink needs the wandb package: pip install wandb, or drop 'wandb' from the sinks"
            ) from None
        mode = mode or os.environ.get("WANDB_MODE") or "offline"
        kwargs = dict(
            project=project or os.environ.get("WANDB_PROJECT") or "rlhf",
            name=run_name,
            config=config or {},
            dir=str(run_dir),
        )
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as error:  # any failure to reach the server: keep training
            if mode == "offline":
                raise
            print(f"wandb: online start failed ({error}); logging offline instead", file=sys.stderr)
            self.run = wandb.init(mode="offline", **kwargs)
        self._warnings: list[dict[str, Any]] = []

    def log(self, step: int, kind: str, record: dict[str, Any]) -> None:
        self.run.log(_numbers(record, kind), step=step)

    def warn(self, record: dict[str, Any]) -> None:
        self._warnings.append(record)
        self.run.summary["warnings"] = [str(r.get("message", "")) for r in self._warnings]

    def close(self) -> None:
        self.run.finish()
