"""The console sink: a progress bar with a compact live line of key metrics, or plain lines in CI logs.

On a terminal a rich progress bar (done/total, elapsed, ETA) and the latest key metrics, redrawn in
place; elsewhere plain lines, at most one per `plain_interval` seconds plus one per
`1/plain_milestones` of the total, and the first and last. Each phase counts in its own units
(`pretrain 3/20`, then `iteration 1/200`); `status(...)` names the part of a step under way, in plain
lines for each phase's first step and a step silent for `plain_interval` seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# label shown on the console -> metric key (the trainer's names); a label is shown once its key was logged
DEFAULT_KEY_METRICS: dict[str, str] = {
    "reward": "reward/proxy_mean",
    "gold": "eval/gold",
    "kl": "kl/ref",
    "ppl": "policy_ppl",
    "len": "response_length",
    "clip": "policy/clip_frac",
}

KeyMetrics = Mapping[str, str] | Sequence[str | tuple[str, str]]
Totals = int | Mapping[str, int] | None  # the steps of the run, or of each phase (kind -> steps)


def normalize_key_metrics(spec: KeyMetrics) -> list[tuple[str, str]]:
    """(label, key) pairs from a {label: key} mapping, or a sequence of keys and (label, key) pairs."""
    if isinstance(spec, Mapping):
        return [(str(label), str(key)) for label, key in spec.items()]
    pairs = []
    for item in spec:
        if isinstance(item, str):
            pairs.append((item, item))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            pairs.append((str(item[0]), str(item[1])))
        else:
            raise ValueError(f"key_metrics: expected a metric key or a (label, key) pair, got {item!r}")
    return pairs


def format_value(value: Any) -> str:
    """Compact number formatting for the live line: 3 significant digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.3g}"


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    seconds = int(round(max(seconds, 0.0)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ConsoleSink:
    """Progress display on `console` (stdout by default); see the module docstring.

    `total`: the steps of the run, or {kind: steps} for a run of phases (each counted in its own
    units). `indexed`: the logged steps are 0-based indexes (the RL loop's `iteration`), so step i
    means i + 1 done."""

    def __init__(
        self,
        total: Totals = None,
        key_metrics: KeyMetrics = DEFAULT_KEY_METRICS,
        run_name: str | None = None,
        *,
        console: Console | None = None,
        start_step: int = 0,
        live: bool | None = None,
        plain_interval: float = 30.0,
        plain_milestones: int = 10,
        clock: Callable[[], float] = time.monotonic,
        indexed: bool = False,
        start_kind: str = "iteration",
    ) -> None:
        self.console = console if console is not None else Console()
        self._totals = dict(total) if isinstance(total, Mapping) else None
        self._one_total = None if isinstance(total, Mapping) else total
        self.indexed = indexed
        self.key_metrics = normalize_key_metrics(key_metrics)
        self.name = run_name or "run"
        self.live = self.console.is_terminal if live is None else live
        self.plain_interval = plain_interval
        self.plain_milestones = max(int(plain_milestones), 1)
        self.clock = clock
        self._start_time = clock()
        self._latest: dict[str, Any] = {}  # label -> last logged value (sticky across records)
        self._step = start_step  # steps done in the current phase
        self._kind = start_kind
        self._first: tuple[int, float] | None = None  # (step, time) of the phase's first record this session
        self._printed_time: float | None = None
        self._printed_step: int | None = None
        self._printed_kind: str | None = None
        self._logged_kinds: set[str] = set()  # phases with a record this session
        self._status = ""  # the part of a step under way, shown until the step's record
        self._dirty = False  # a record arrived since the last plain line
        self._progress: Progress | None = None
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}{task.fields[metrics]}"),
                console=self.console,
                refresh_per_second=2,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                self._description(), total=self.total, completed=start_step, metrics="", status=""
            )

    @property
    def total(self) -> int | None:
        """The steps of the current phase (None: unknown)."""
        return self._totals.get(self._kind) if self._totals is not None else self._one_total

    def _description(self) -> str:
        return f"{self.name} {self._kind}" if self._totals is not None else self.name

    def metrics_line(self) -> str:
        return "  ".join(
            f"{label} {format_value(self._latest[label])}"
            for label, _ in self.key_metrics
            if label in self._latest
        )

    def _eta(self, now: float) -> float | None:
        if self.total is None or self._first is None:
            return None
        first_step, first_time = self._first
        done, elapsed = self._step - first_step, now - first_time
        if done <= 0 or elapsed <= 0:
            return None
        return (self.total - self._step) * elapsed / done

    def plain_line(self, now: float) -> str:
        progress = f"{self._kind} {self._step}"
        if self.total:
            progress += f"/{self.total} ({100 * self._step / self.total:.0f}%)"
        parts = [f"[{self.name}] {progress}", f"elapsed {format_duration(now - self._start_time)}"]
        if self.total:
            parts.append(f"eta {format_duration(self._eta(now))}")
        line = " | ".join(parts)
        metrics = self.metrics_line()
        return f"{line} | {metrics}" if metrics else line

    def _plain_due(self, step: int, now: float) -> bool:
        if self._printed_time is None or self._printed_kind != self._kind:
            return True  # the first line of the run, or of a phase
        if self.total and step >= self.total and (self._printed_step or 0) < self.total:
            return True
        if now - self._printed_time >= self.plain_interval:
            return True
        if self.total:
            bucket = self.plain_milestones / self.total
            return int(step * bucket) > int((self._printed_step or 0) * bucket)
        return False

    def _print_plain(self, now: float) -> None:
        self.console.print(escape(self.plain_line(now)), highlight=False, soft_wrap=True)
        self._printed_time, self._printed_step, self._dirty = now, self._step, False
        self._printed_kind = self._kind

    def _enter_phase(self, kind: str, done: int) -> None:
        """Switch the display to phase `kind` (its own total, ETA and milestones)."""
        if kind == self._kind:
            return
        if self._progress is None and self._dirty:
            self._print_plain(self.clock())  # the previous phase's last count
        self._kind, self._step, self._first = kind, done, None
        if self._progress is not None:
            self._progress.reset(
                self._task, total=self.total, completed=done, description=self._description()
            )

    def log(self, step: int, kind: str, record: dict[str, Any], done: int | None = None) -> None:
        """Show record `step` of phase `kind`; `done`: the steps done when it was made, when not
        the usual (`step`, or `step + 1` when indexed), e.g. 0 for an evaluation before step 0."""
        if done is None:
            done = step + 1 if self.indexed else step
        self._enter_phase(kind, done)
        now = self.clock()
        if self._first is None:
            self._first = (done, now)
        self._step, self._status = done, ""
        self._logged_kinds.add(kind)
        for label, key in self.key_metrics:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._latest[label] = value
        if self._progress is not None:
            self._progress.update(self._task, completed=done, metrics=escape(self.metrics_line()), status="")
            return
        self._dirty = True
        if self._plain_due(done, now):
            self._print_plain(now)

    def status(self, what: str, done: int, kind: str) -> None:
        """Say that step `done + 1` of phase `kind` is at `what` ("sampling", "updating", ...)."""
        self._enter_phase(kind, done)
        self._step, self._status = done, what
        if self._first is None:  # the phase starts: its ETA counts from here
            self._first = (done, self.clock())
        if self._progress is not None:
            label = f"{self._kind} {done + 1}: {what}  "
            self._progress.update(self._task, completed=done, status=escape(label))
            return
        now = self.clock()
        long_step = self._printed_time is not None and now - self._printed_time >= self.plain_interval
        if kind in self._logged_kinds and not long_step:
            return  # a later step: its record follows soon
        progress = f"{kind} {done + 1}" + (f"/{self.total}" if self.total else "")
        line = f"[{self.name}] {progress}: {what} ... | elapsed {format_duration(now - self._start_time)}"
        self.console.print(escape(line), highlight=False, soft_wrap=True)
        self._printed_time = now

    def warn(self, record: dict[str, Any]) -> None:
        kind = next((k for k in (self._kind, "iteration", "step") if k in record), self._kind)
        step = record.get(kind)
        if self.indexed and isinstance(step, int):
            step += 1  # counted as the progress line counts: the (i+1)-th
        where = f" ({kind} {step})" if step is not None else ""
        self.console.print(
            f"[bold black on yellow] WARNING [/]{escape(where)} [yellow]{escape(str(record.get('message', '')))}[/]",
            highlight=False,
            soft_wrap=True,
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self._dirty:
            self._print_plain(self.clock())
