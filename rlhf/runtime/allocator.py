"""Keep freed memory in the process for reuse (glibc malloc), so training steps stop page-faulting.

Every step frees its activations and allocates the same sizes again at the next one. By default
glibc hands large freed blocks back to the OS (blocks over its mmap threshold are unmapped, free
space at the top of the heap is trimmed), so the next step faults every page back in and the kernel
zeroes it: about 30,000 minor faults per iteration of the small-4x4 benchmark, 640,000 per
SmolLM2-135M iteration (docs/speed.md, `runtime.keep_freed_memory`). Raising both thresholds keeps that memory for reuse, as
caching allocators (jemalloc, tcmalloc, PyTorch's GPU allocator) do. The cost: the resident set
stays near its peak between steps instead of shrinking.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own dynamic maximum: larger blocks stay mmapped (never fragment the heap)
TRIM_THRESHOLD = 2**31 - 1  # free heap memory kept before returning any of it (mallopt takes an int)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_in_force = False


def keep_freed_memory() -> bool:
    """Ask glibc malloc to keep freed memory for reuse; True when the settings are in force.

    Process-wide and idempotent. Does nothing (returns False) off glibc (macOS, Windows, musl) and
    when the user tuned malloc through its environment variables (their setting wins)."""
    global _in_force
    if _in_force:
        return True
    if not sys.platform.startswith("linux") or any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        if not hasattr(libc, "gnu_get_libc_version"):
            return False  # not glibc
        _in_force = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    except (OSError, AttributeError):
        return False
    return _in_force
