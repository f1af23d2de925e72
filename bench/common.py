"""Helpers shared by every benchmark: threads, a quiet offline environment, subprocess cases and
their JSON results, and device-safe timing and peak memory.

CUDA kernels run asynchronously, so every timed region waits for the device at both ends
(`synchronize`, a no-op on the CPU). Peak memory is `torch.cuda.max_memory_allocated` since the
last `reset_peak_memory` on CUDA, the process's peak resident set on the CPU.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def child_env(threads: int) -> dict[str, str]:
    """The environment of a benchmark subprocess: offline, quiet, `threads` intra-op threads."""
    env = dict(os.environ)
    env.update(QUIET_ENV)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def set_threads(threads: int) -> None:
    """Fix torch's intra-op thread count and silence library warnings in this process."""
    import torch

    os.environ.update(QUIET_ENV)
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def emit(result: dict) -> None:
    """Print the result as the last stdout line (the parent reads it)."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def run_case(cmd: list[str], *, env: dict[str, str], cwd: str, timeout: float) -> dict:
    """Run one benchmark subprocess; return its last-line JSON plus `wall_s`, `maxrss_mb` (the
    child's own peak RSS from wait4) and, on failure, `error` with the tail of its stderr."""
    import subprocess
    import tempfile
    import time

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.1)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen consistent
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    result: dict = {}
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            result = {}
    if not result:
        reason = "timed out" if wall > timeout else f"exit code {proc.returncode}"
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        result = {"error": f"{' '.join(cmd[-6:])}: {reason}\n{tail}"}
    result["wall_s"] = round(wall, 2)
    result["maxrss_mb"] = round(usage.ru_maxrss / 1024.0, 1) if usage is not None else None
    # cores this child actually got on average (2.0 = both cores the whole time)
    result["cores_used"] = (
        round((usage.ru_utime + usage.ru_stime) / wall, 2) if usage is not None and wall else None
    )
    return result


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on `device` has finished (nothing to wait for on the CPU)."""
    import torch

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
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> dict:
    """{"peak_mb", "kind"}: CUDA max_memory_allocated since `reset_peak_memory`, or the CPU peak RSS."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return {
            "peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "kind": "cuda_allocated",
        }
    return {"peak_mb": round(peak_rss_mb(), 1), "kind": "cpu_peak_rss"}
