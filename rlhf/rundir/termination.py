"""SIGTERM, what SLURM and Kubernetes send before they preempt a job, ends a run as Ctrl-C does.

Python's default SIGTERM kills the process at once: no message, no resume line. `handle_sigterm`
turns it into `Terminated` (a KeyboardInterrupt), so the command ends the way Ctrl-C ends it: the
step under way is abandoned (its half-done update is never saved), the run's records are closed and
the command that resumes it is printed, with exit code 143 (128 + SIGTERM). A signal that arrives
while a checkpoint or an export is being written (`finish_first`) waits until that write is done,
so a checkpoint that was due is kept.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

TERMINATED_EXIT = 128 + signal.SIGTERM  # 143, as a shell reports a process ended by SIGTERM


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


_state = {"depth": 0, "pending": False}


def _on_sigterm(signum, frame) -> None:
    if _state["depth"]:
        _state["pending"] = True  # raised once the write under way is complete
        return
    raise Terminated()


@contextlib.contextmanager
def finish_first() -> Iterator[None]:
    """A write that SIGTERM must not cut short (a checkpoint, an export): a SIGTERM received in the
    body raises `Terminated` after it."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
    if not _state["depth"] and _state["pending"]:  # the write is complete (a failed one raised already)
        _state["pending"] = False
        raise Terminated()


@contextlib.contextmanager
def handle_sigterm() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the body (main thread only; elsewhere nothing changes); the
    previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _state["pending"] = False
