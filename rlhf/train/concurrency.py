"""Two independent pieces of CPU work side by side, one thread each.

The policy's and the separate critic's PPO updates share no parameter, so on a CPU they can run at
the same time. Small minibatches (a few rows) keep matrix products short, and splitting each
product over all cores (torch's intra-op threads) wastes much of the machine on synchronisation;
giving each model its own share of the cores keeps every core busy on large-enough work. Torch ops
release the GIL, so two Python threads are enough. Measured in bench/NOTES.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import torch


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def side_by_side_threads() -> int | None:
    """Intra-op threads per side when two CPU jobs run side by side, or None when they should not:
    one core only (two threads would just take turns). The current intra-op threads are split
    evenly, at least one each, so one torch thread on a multi-core machine becomes one per side."""
    if available_cores() < 2:
        return None
    return max(1, torch.get_num_threads() // 2)


def run_side_by_side(
    here: Sequence[Callable[[], None]], beside: Sequence[Callable[[], None]], threads_each: int
) -> None:
    """Run the steps `beside` in order on a helper thread while the steps `here` run in order on
    this one, each side with `threads_each` intra-op threads; this thread's setting is restored
    afterwards. An error on either side stops the other at its next step; the first is re-raised.

    Each side's thread count is fixed, so a run is as reproducible as a sequential one (a side
    that finished early does not lend its cores: which step would get them depends on timing)."""
    previous = torch.get_num_threads()
    failures: list[BaseException] = []

    def run(steps: Sequence[Callable[[], None]]) -> None:
        torch.set_num_threads(threads_each)  # OpenMP's setting is per thread: set it in each one
        try:
            for step in steps:
                if failures:
                    return
                step()
        except BaseException as error:  # re-raised in the caller's thread
            failures.append(error)

    worker = threading.Thread(target=run, args=(beside,), name="rlhf-side-by-side", daemon=True)
    try:
        worker.start()
        run(here)
    except BaseException as error:  # outside a step (run() records those): stop the helper too
        failures.append(error)
    finally:
        while worker.is_alive():  # never return while the helper still changes a model
            try:
                worker.join()
            except BaseException as error:  # e.g. a second Ctrl-C: the helper stops at its next step
                failures.append(error)
        torch.set_num_threads(previous)
    if failures:
        raise failures[0]
