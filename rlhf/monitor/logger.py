"""`MetricsLogger`: one call per iteration fans a metrics dict out to every sink of a run.

    with MetricsLogger("runs/rl", total=200, config=asdict(cfg)) as logger:
        logger.log(iteration, {"reward/proxy_mean": 0.51, "kl/ref": 0.012})   # step 1 is the first
        logger.warn(message)
        logger.log_samples(iteration, [{"prompt": ..., "response": ..., "score": 0.3}])

The jsonl record is `{"iteration": 1, "reward/proxy_mean": 0.51, ...}` (the step key is `kind`:
"iteration" for RL, "step" for SFT and RM); samples go to `samples.jsonl` beside `metrics.jsonl`. A
resumed run drops the lines of steps after its checkpoint in both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

from rich.console import Console

from rlhf.monitor.console import DEFAULT_KEY_METRICS, ConsoleSink, KeyMetrics, Totals
from rlhf.monitor.records import flatten_metrics, read_metrics
from rlhf.monitor.sinks import JsonlSink, Sink, TensorBoardSink, WandbSink

SINK_NAMES = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"  # sample responses of logged steps, one JSON object per response

__all__ = ["MetricsLogger", "read_metrics", "SINK_NAMES", "METRICS_FILE", "SAMPLES_FILE"]


class MetricsLogger:
    """Logs metric dicts of a run to its sinks; see the module docstring.

    Args:
        run_dir: the run directory; `metrics.jsonl` is written in it (created if missing).
        sinks: names among "console", "jsonl", "tensorboard" (into run_dir/tensorboard), "wandb"
            (offline unless WANDB_MODE says otherwise), or objects with log/warn/close methods.
        total: the number of steps of the run, for the progress bar and ETA (None: unknown), or
            {kind: steps} for a run of phases, each counted in its own units.
        key_metrics: the metrics shown on the console line, {label: key} or a list of keys.
        run_name: shown on the console and given to wandb.
        config: the resolved run configuration, given to tensorboard (as text) and wandb.
        resume: continue an existing run: append to metrics.jsonl; with `resume_step`, drop the
            records of steps > resume_step first (they were written after the checkpoint).
        overwrite: start over, replacing an existing metrics.jsonl (otherwise that is an error).
        console: the rich Console to draw on (default: stdout).
        indexed: the steps logged are 0-based indexes (step i: i + 1 done), as the RL loop's.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        sinks: Sequence[str | Sink] = ("console", "jsonl"),
        total: Totals = None,
        key_metrics: KeyMetrics = DEFAULT_KEY_METRICS,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        resume: bool = False,
        resume_step: int | None = None,
        overwrite: bool = False,
        console: Console | None = None,
        indexed: bool = False,
    ) -> None:
        if isinstance(sinks, str):
            sinks = (sinks,)
        if resume_step is not None and not resume:
            raise ValueError("MetricsLogger: resume_step is only meaningful with resume=True")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.last_step: int | None = resume_step  # the highest step logged so far
        self._last_kind = "iteration"
        self._closed = False
        self._samples: JsonlSink | None = None  # opened by the first log_samples call
        self._samples_resume = (resume, resume_step)
        self.sinks: list[Sink] = []
        config_dict = dict(config) if config is not None else None
        try:
            for sink in sinks:
                if not isinstance(sink, str):
                    if not isinstance(sink, Sink):
                        raise TypeError(
                            f"MetricsLogger: a sink must be one of {SINK_NAMES} or have log/warn/close, got {sink!r}"
                        )
                    self.sinks.append(sink)
                elif sink == "jsonl":
                    jsonl = JsonlSink(
                        self.metrics_path, resume=resume, resume_step=resume_step, overwrite=overwrite
                    )
                    self.last_step = jsonl.last_step if resume_step is None else resume_step
                    self.sinks.append(jsonl)
                elif sink == "console":
                    if resume_step is None:
                        start = 0
                    else:  # steps done when the run resumes
                        start = max(0, resume_step + 1) if indexed else resume_step
                    self.sinks.append(
                        ConsoleSink(
                            total, key_metrics, run_name, console=console, start_step=start, indexed=indexed
                        )
                    )
                elif sink == "tensorboard":
                    self.sinks.append(TensorBoardSink(self.run_dir / "tensorboard", config=config_dict))
                elif sink == "wandb":
                    self.sinks.append(WandbSink(self.run_dir, run_name=run_name, config=config_dict))
                else:
                    raise ValueError(
                        f"MetricsLogger: unknown sink {sink!r}; choose among {', '.join(SINK_NAMES)}"
                    )
        except BaseException:
            self.close()
            raise

    def log(
        self, step: int, metrics: Mapping[str, Any], kind: str = "iteration", *, done: int | None = None
    ) -> dict[str, Any]:
        """Send one record `{kind: step, **metrics}` to every sink; return the record as written.

        Values may be floats, ints, tensors, numpy values or lists; nested dicts are flattened
        to "outer/inner" keys; NaN and infinities are written as null. `done`: the steps done when
        the record was made, for the progress display, when not the usual (e.g. 0 for held-out
        figures before the first update, recorded at step 0).
        """
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, Integral) or step < 0:
            raise ValueError(f"MetricsLogger.log: step must be a non-negative int, got {step!r}")
        if not isinstance(kind, str) or not kind or kind == "event":
            raise ValueError(
                f"MetricsLogger.log: kind must be a step name such as 'iteration' or 'step', got {kind!r}"
            )
        if not isinstance(metrics, Mapping):
            raise TypeError(f"MetricsLogger.log: metrics must be a dict, got {type(metrics).__name__}")
        step = int(step)
        flat = flatten_metrics(metrics)
        if kind in flat and flat[kind] != step:
            raise ValueError(
                f"MetricsLogger.log: metrics[{kind!r}] = {flat[kind]!r} disagrees with step {step}"
            )
        record = {kind: step, **{k: v for k, v in flat.items() if k != kind}}
        for sink in self.sinks:
            if done is not None and isinstance(sink, ConsoleSink):
                sink.log(step, kind, record, done=done)
            else:
                sink.log(step, kind, record)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        self._last_kind = kind
        return record

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]], kind: str = "iteration") -> None:
        """Append `{kind: step, **row}` per row to `samples.jsonl` (only when the jsonl sink is on)."""
        self._check_open()
        if not any(isinstance(sink, JsonlSink) for sink in self.sinks):
            return
        if self._samples is None:
            resume, resume_step = self._samples_resume
            self._samples = JsonlSink(
                self.run_dir / SAMPLES_FILE, resume=resume, resume_step=resume_step, overwrite=not resume
            )
        for row in rows:
            record = {kind: int(step), **{k: v for k, v in flatten_metrics(row).items() if k != kind}}
            self._samples.log(int(step), kind, record)

    def warn(
        self, message: str, step: int | None = None, kind: str | None = None, code: str | None = None
    ) -> dict[str, Any]:
        """Show `message` highlighted and record `{"event": "warning", kind: step, "message": ...}`
        (with `"code": code` when given: a name for programs, e.g. "policy_not_moving").

        `step` defaults to the last logged step, `kind` to the last logged kind.
        """
        self._check_open()
        kind = kind or self._last_kind
        step = self.last_step if step is None else int(step)
        record: dict[str, Any] = {"event": "warning"}
        if step is not None:
            record[kind] = step
        if code is not None:
            record["code"] = str(code)
        record["message"] = str(message)
        for sink in self.sinks:
            sink.warn(record)
        return record

    def status(self, what: str, done: int, kind: str = "iteration") -> None:
        """Show that the step after the `done` first of phase `kind` is at `what` ("sampling", ...):
        a sign of life during a long step, on the sinks that display one (the console); not recorded."""
        self._check_open()
        for sink in self.sinks:
            show = getattr(sink, "status", None)
            if callable(show):
                show(what, done, kind)

    def close(self) -> None:
        """Close every sink (idempotent): flushes files, stops the progress bar, finishes wandb."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for sink in self.sinks + ([self._samples] if self._samples is not None else []):
            try:
                sink.close()
            except Exception as error:  # close the other sinks regardless
                errors.append(error)
        if errors:
            raise errors[0]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MetricsLogger is closed; create a new one (resume=True to continue the run)")

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
