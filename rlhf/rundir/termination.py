"""SIGTERM, what SLURM and Kubernetes send before they preempt a job, ends a run as Ctrl-C does;
neither cuts a checkpoint or an export short.

`handle_sigterm` turns SIGTERM into `Terminated` (a KeyboardInterrupt): the step under way is
abandoned, the run's records are closed and the resume command is printed, exit code 143. A Ctrl-C
or SIGTERM that arrives during a checkpoint or export write (`finish_first`) waits until the write is
complete, then is delivered where it would have gone, so the checkpoint that was due is kept; a
second Ctrl-C during the write stops at once (the write is atomic)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

TERMINATED_EXIT = 128 + signal.SIGTERM  # 143, as a shell reports a process ended by SIGTERM
DEFERRED = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


_state: dict = {"depth": 0, "pending": []}


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _defer(signum, frame) -> None:
    pending = _state["pending"]
    if signum == signal.SIGINT and signal.SIGINT in pending:
        raise KeyboardInterrupt()  # Ctrl-C twice: the user will not wait (the write is atomic)
    if signum not in pending:
        pending.append(signum)
    what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    # os.write, not print: a handler may run inside a print to stderr (a reentrant call)
    os.write(
        2,
        f"\n{what}: finishing the checkpoint or export being written first (Ctrl-C again: stop now)\n".encode(),
    )


@contextlib.contextmanager
def finish_first() -> Iterator[None]:
    """A write that Ctrl-C and SIGTERM must not cut short (a checkpoint, an export): a signal received
    in the body is delivered after it, when the body completed (after a failure the error is raised
    and the signal dropped). Nests; in a thread other than the main one it changes nothing (signals
    reach the main thread only)."""
    outer = _state["depth"] == 0 and threading.current_thread() is threading.main_thread()
    previous = {}
    if outer:
        _state["pending"] = []
        for signum in DEFERRED:
            handler = signal.getsignal(signum)
            if handler is not signal.SIG_IGN:  # an ignored signal (nohup, `&`) stays ignored
                previous[signum] = signal.signal(signum, _defer)
    _state["depth"] += 1
    completed = False
    try:
        yield
        completed = True
    finally:
        _state["depth"] -= 1
        if outer:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            pending, _state["pending"] = _state["pending"], []
    if outer and completed:
        for signum in pending:  # the handler in place again: KeyboardInterrupt, Terminated, or the default
            signal.raise_signal(signum)


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
