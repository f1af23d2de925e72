"""Two independent pieces of CPU work side by side, one thread each (`runtime.overlap_critic`).

The policy's and a separate critic's updates share no parameter; small minibatches make short
products, which split badly over every core, so each side gets its share of the cores (torch ops
release the GIL). The side with more work runs on the caller's thread and takes every core once the
other is done (`handover_step`, from FLOP counts: flops.py; docs/speed.md). Thread counts follow
what the process is given (`thread_budget`): OMP_NUM_THREADS, else the affinity mask within the
cgroup quota; under torchrun each rank gets `cores // local ranks` (torchrun's own default of 1 is
ignored: `launcher_default_omp`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD", or "max PERIOD"
PROC = Path("/proc")  # a process's initial environment: /proc/PID/environ (Linux)


def omp_num_threads() -> int | None:
    """OMP_NUM_THREADS as a positive number, or None when it is unset or not one."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip().split(",")[0]  # "4,2": nested levels
    return int(value) if value.isdigit() and int(value) > 0 else None


def cgroup_cpus(path: Path | None = None) -> int | None:
    """The CPUs a cgroup v2 quota allows (quota / period, rounded up, at least 1), or None: no
    quota ("max"), no such file (cgroup v1, macOS), or a file that cannot be read."""
    try:
        quota, period = (path or CGROUP_CPU_MAX).read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (`taskset`, a batch scheduler's CPU
    set) where the OS reports one, else every core, capped by a cgroup CPU quota (a container's
    `--cpus`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpus()
    return max(1, min(cores, quota) if quota is not None else cores)


def _parent_started_with(name: str) -> bool | None:
    """Whether the parent process's environment held `name` when it started (None: not known, e.g.
    no /proc). A variable the parent set in itself later (torchrun's os.environ) is not there."""
    try:
        entries = (PROC / str(os.getppid()) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return any(entry.split(b"=", 1)[0] == name.encode() for entry in entries)


def launcher_default_omp() -> bool:
    """OMP_NUM_THREADS=1 was set by torchrun, not by the user: torchrun (torch/distributed/run.py)
    sets it for its workers when it is unset and there are several ranks per node. Told apart by the
    torchrun process's own environment at start (the workers' parent): it lacked the variable."""
    if os.environ.get("OMP_NUM_THREADS", "").strip() != "1" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    return _parent_started_with("OMP_NUM_THREADS") is False


def local_ranks() -> int:
    """Processes of this launch on this node (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def thread_budget() -> int:
    """The threads this process may use in all: its share of `available_cores()` (all of them, or
    under torchrun the cores divided by the ranks on this node, at least 1), lowered to an explicit
    OMP_NUM_THREADS (one torchrun set by default is not the user's: `launcher_default_omp`)."""
    share = max(1, available_cores() // local_ranks())
    explicit = None if launcher_default_omp() else omp_num_threads()
    return min(explicit, share) if explicit else share


def oversubscription_note() -> str | None:
    """What `thread_budget` did to an explicit OMP_NUM_THREADS it lowered (None when it did not)."""
    explicit = None if launcher_default_omp() else omp_num_threads()
    budget = thread_budget()
    if explicit is None or explicit <= budget:
        return None
    ranks = local_ranks()
    who = f"{ranks} ranks on this node" if ranks > 1 else "this process"
    return (
        f"OMP_NUM_THREADS={explicit} is more threads than {who} may use ({available_cores()} cores): "
        f"{budget} thread(s) per process instead, so that the cores are not oversubscribed."
    )


def limit_threads() -> int:
    """Lower torch's intra-op threads to `thread_budget()` where they exceed it (torch's default is
    every core of the machine, whatever the affinity mask or the container's quota); never raises
    them. Returns the count in effect."""
    budget = thread_budget()
    if torch.get_num_threads() > budget:
        torch.set_num_threads(budget)
    return torch.get_num_threads()


def side_by_side_threads() -> int | None:
    """Intra-op threads per side when two CPU jobs run side by side, or None when they should not:
    a budget of one thread (one core, or OMP_NUM_THREADS=1: two threads would just take turns, or
    exceed what the user allowed). The current intra-op threads, at most the budget, are split
    evenly, at least one each, so one torch thread on a multi-core machine becomes one per side."""
    budget = thread_budget()
    if budget < 2:
        return None
    return max(1, min(torch.get_num_threads(), budget) // 2)


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
    return torch.cat([p for p in parts if p is not None])  # both halves ran
