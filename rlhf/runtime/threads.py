"""Two independent pieces of CPU work side by side, one thread each.

The policy's and the separate critic's PPO updates share no parameter, so on a CPU they can run at
the same time. Small minibatches (a few rows) keep matrix products short, and splitting each
product over all cores (torch's intra-op threads) wastes much of the machine on synchronisation;
giving each model its own share of the cores keeps every core busy on large-enough work. Torch ops
release the GIL, so two Python threads are enough. The side with more work runs on the caller's
thread and takes every core for its last steps, once the other side is done (`handover_step`
predicts when from FLOP counts, flops.py). Measured in bench/NOTES.md.
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
    here: Sequence[Callable[[], None]],
    beside: Sequence[Callable[[], None]],
    threads_each: int,
    handover_at: int | None = None,
) -> None:
    """Run the steps `beside` in order on a helper thread while the steps `here` run in order on
    this one, each side with `threads_each` intra-op threads; this thread's setting is restored
    afterwards. An error on either side stops the other at its next step; the first is re-raised.

    `handover_at` (the longer side goes `here`): after that many of its steps this thread waits
    for the helper to finish, then runs its remaining steps with all of its previous threads, so
    the core the helper used does not idle while the longer side ends alone. The hand-over point
    is a step count, never a clock reading, so a run is as reproducible as a sequential one
    (which step gets more threads, and so the float rounding, does not depend on timing)."""
    previous = torch.get_num_threads()
    failures: list[BaseException] = []
    split = len(here) if handover_at is None else max(0, min(handover_at, len(here)))
    # autograd's modes are per thread: the helper takes the caller's (e.g. inference mode)
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def run(steps: Sequence[Callable[[], None]], threads: int) -> None:
        torch.set_num_threads(threads)  # OpenMP's setting is per thread: set it in each one
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                for step in steps:
                    if failures:
                        return
                    step()
        except BaseException as error:  # re-raised in the caller's thread
            failures.append(error)

    worker = threading.Thread(target=run, args=(beside, threads_each), name="rlhf-side-by-side", daemon=True)
    try:
        worker.start()
        run(here[:split], threads_each)
    except BaseException as error:  # outside a step (run() records those): stop the helper too
        failures.append(error)
    finally:
        while worker.is_alive():  # never return while the helper still changes a model
            try:
                worker.join()
            except BaseException as error:  # e.g. a second Ctrl-C: the helper stops at its next step
                failures.append(error)
        torch.set_num_threads(previous)
    if not failures and split < len(here):
        run(here[split:], previous)  # the helper is done: this side takes every core
    if failures:
        raise failures[0]


def by_row_halves(
    compute: Callable[[slice], torch.Tensor], rows: int, threads_each: int | None
) -> torch.Tensor:
    """`compute(slice(0, rows))`, or with `threads_each` the first and the second half of the rows
    side by side (`run_side_by_side`), joined along dim 0. For no-grad forwards of a rollout: each row's
    result does not depend on the others, so only float rounding may differ, and the split is fixed
    (never timing-dependent), so a run stays reproducible. `compute` may run on two threads at once:
    it must not change shared state (a LoRA adapter's on/off switch is set once, around this call)."""
    if threads_each is None or rows < 2:
        return compute(slice(0, rows))
    half = (rows + 1) // 2
    parts: list[torch.Tensor | None] = [None, None]

    def part(index: int, where: slice) -> Callable[[], None]:
        def run() -> None:
            parts[index] = compute(where)

        return run

    run_side_by_side([part(0, slice(0, half))], [part(1, slice(half, rows))], threads_each)
    return torch.cat(parts)
