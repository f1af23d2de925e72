"""Progress of long phases that are not training loops: counted work (prompts sampled, pairs scored)
with elapsed time and ETA, and slow single steps (loading a model) announced with their duration.

Counted work goes through the console sink, so it looks like training progress: a live bar on a
terminal, plain lines in logs, e.g. `[policy: sampling] prompt 64/256 (25%) | elapsed 0:00:10 |
eta 0:00:30` (at most one line per `plain_interval` seconds plus one per tenth of the total).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape

from rlhf.monitor.console import ConsoleSink


class WorkProgress:
    """`total` items of `unit` done in chunks: `advance(n)` after each chunk, `close()` at the end
    (or use it as a context manager). A line for 0 done is shown at once: a phase is never silent."""

    def __init__(
        self,
        name: str,
        total: int,
        unit: str = "item",
        *,
        console: Console | None = None,
        live: bool | None = None,
        plain_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.unit, self.done = total, unit, 0
        self._sink = ConsoleSink(
            total=total,
            key_metrics=(),
            run_name=name,
            console=console,
            live=live,
            plain_interval=plain_interval,
            clock=clock,
        )
        self._sink.log(0, unit, {})

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._sink.log(self.done, self.unit, {})

    def close(self) -> None:
        self._sink.close()

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def announce(
    what: str, *, console: Console | None = None, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """Print `what ...` before a slow step and `what: done (1.2 s)` after it (nothing after a failure:
    the error says what went wrong)."""
    console = console if console is not None else Console()
    console.print(escape(f"{what} ..."), highlight=False, soft_wrap=True)
    start = clock()
    yield
    console.print(escape(f"{what}: done ({clock() - start:.1f} s)"), highlight=False, soft_wrap=True)
