"""The machine's float32 matmul rate (the FLOP ceiling the phases are compared with) and its load.

.venv/bin/python -m bench.speed.machine --size 2048 --reps 10 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.common import emit, set_threads


def matmul_rates(
    size: int = 2048, reps: int = 10, warmup: int = 2, device: str = "cpu", dtype: str = "float32"
) -> list[float]:
    """GFLOP/s of `reps` [size, size] @ [size, size] products (2 size^3 FLOPs each) in `dtype` on
    `device` (the device idle at both ends of each product: bench/common.py)."""
    import torch

    from bench.common import timed

    kind = getattr(torch, dtype)
    a = torch.randn(size, size, dtype=kind, device=device)
    b = torch.randn(size, size, dtype=kind, device=device)
    out = torch.empty(size, size, dtype=kind, device=device)
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    rates = []
    for _ in range(reps):
        seconds, _ = timed(lambda: torch.matmul(a, b, out=out), device)
        rates.append(2.0 * size**3 / seconds / 1e9)
    return rates


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages (runnable processes; this machine has os.cpu_count() cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    rates = matmul_rates(args.size, args.reps)
    emit(
        {
            "size": args.size,
            "threads": args.threads,
            "gflops": [round(r, 2) for r in rates],
            "gflops_max": max(rates),
            "gflops_median": statistics.median(rates),
            "load_average": load_average(),
        }
    )


if __name__ == "__main__":
    main()
