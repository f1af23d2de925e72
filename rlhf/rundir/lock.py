"""One writer per run directory: an exclusive `flock` on `RUN_DIR/.lock`, held for the whole run.

The lock belongs to the open file, so the kernel releases it whenever the process ends, however
it ends (normal exit, exception, SIGINT, kill -9): a lock file left behind by a dead process is
never mistaken for a live one. The file holds the pid of its holder, for the message of the
process that finds the directory taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from rlhf.config import ConfigError

LOCK_FILE = ".lock"


class RunDirInUse(ConfigError):
    """Another live process is writing into the run directory."""


def _holder_pid(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode(errors="replace").strip()
    return text or "unknown"


def _lock_or_refuse(fd: int, directory: Path) -> None:
    """Take the exclusive lock on `fd` without waiting; `RunDirInUse` naming the holder's pid if taken."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunDirInUse(
            f"run directory {directory} is in use by another rlhf process (pid {_holder_pid(fd)}). "
            "Fix: wait for that run to finish (or stop it), or pass another --out."
        ) from None


def refuse_if_in_use(run_dir: str | os.PathLike) -> None:
    """Raise `RunDirInUse` when another live process holds the lock of `run_dir` (checked and let go
    at once; nothing is created): a busy directory is said as such before any other check of it."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return  # no lock file (or none we may open): nobody holds it
    try:
        _lock_or_refuse(fd, Path(run_dir))
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_dir_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock of `run_dir` (created if missing) for the body of the `with`.

    Raises `RunDirInUse` naming the directory and the holder's pid when another process holds it.
    """
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock_or_refuse(fd, directory)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _clean_killed_exports(directory)
        yield directory
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _clean_killed_exports(directory: Path) -> None:
    """What a killed export into this run directory left (its holder is gone: the lock is ours)."""
    import sys

    from rlhf.rundir.checkpoint import recover_exports

    for line in recover_exports(directory, owned=True):
        print(f"note: {line}", file=sys.stderr)


@contextlib.contextmanager
def writer_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """`run_dir_lock(run_dir)` in the process that writes the run (rank 0 under torchrun); the other
    ranks write nothing there and take no lock, but stop with rank 0 when the directory is taken
    (`agreed_on_rank0`: none waits for a rank that stopped)."""
    from rlhf.parallel.process_group import agreed_on_rank0, is_writer_process

    with contextlib.ExitStack() as stack:
        agreed_on_rank0(lambda: stack.enter_context(run_dir_lock(run_dir)) if is_writer_process() else None)
        yield Path(run_dir)
