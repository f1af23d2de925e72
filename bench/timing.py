"""Timing and peak memory on any device: the CPU bench's clocks, made safe for CUDA.

CUDA kernels run asynchronously: a Python clock read right after a call measures only the launch.
Every timed region here therefore waits for the device before it starts and before it stops
(`synchronize`, a no-op on the CPU, so CPU figures are taken exactly as before). Peak memory is
`torch.cuda.max_memory_allocated` since the last `reset_peak_memory` on CUDA (tensors only, the
caching allocator's reserve excluded), and the process's peak resident set on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

from bench.common import peak_rss_mb

T = TypeVar("T")


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on `device` has finished (nothing to wait for on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device | str) -> tuple[float, T]:
    """(seconds, result) of `fn()`, the device idle at both ends of the measured interval."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def synchronized_after(owner: object, name: str, device: torch.device | str) -> None:
    """Make `owner.name(...)` wait for `device` before returning, so a clock read just after the
    call (the trainer's phase boundaries) includes the work that call queued."""
    call = getattr(owner, name)

    def waiting(*args, **kwargs):
        result = call(*args, **kwargs)
        synchronize(device)
        return result

    setattr(owner, name, waiting)


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak-memory window on CUDA (the CPU's peak RSS cannot be reset)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> dict:
    """{"peak_mb", "kind"}: CUDA max_memory_allocated since `reset_peak_memory`, or the CPU peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return {
            "peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "kind": "cuda_allocated",
        }
    return {"peak_mb": round(peak_rss_mb(), 1), "kind": "cpu_peak_rss"}
