"""Data parallelism on this machine: 2 ranks x 1 thread (torchrun, `dist.strategy ddp`) against
1 process x 2 threads, on the same PPO workload, and the time of the forward results' gathers (the
gradient all-reduce runs inside DDP's backward hooks: in the update phase's time).

    .venv/bin/python -m bench.speed.data_parallel compare --workload small-4x4 --iters 6 --reps 2
    .venv/bin/python -m bench.speed.data_parallel run --workload small-4x4 --iters 6 --threads 2   # one case

Both sides run the same global batch (B=16) and get the same numbers (tests/runtime); only the
time differs. On a 2-core CPU parity is the best to expect: two ranks split the sampling, the
forwards and the optimizer steps' rows (each rank samples its rows with the whole batch's random
numbers, so the tokens do not depend on the number of ranks), and the cores are the same two.
Each case's last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import child_env, emit, peak_rss_mb, run_case, set_threads  # noqa: E402
from bench.speed.ours import PHASES, build_trainer, record_shapes, run_iterations  # noqa: E402
from bench.speed.workload import WORKLOADS  # noqa: E402


class Stopwatch:
    """Total seconds and calls of a wrapped function (the peers' collectives)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed


def run(workload_name: str, iters: int, warmup: int, threads: int) -> dict:
    """`iters` PPO iterations of the workload in this process, or on this rank under torchrun."""
    from rlhf.config import DistConfig
    from rlhf.parallel.process_group import data_parallel
    from rlhf.runtime import DistributedRuntime

    set_threads(threads)
    workload = next(w for w in WORKLOADS if w.name == workload_name)
    strategy = "ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "none"
    with (
        data_parallel(DistConfig(strategy=strategy), "cpu") as parallel,
        tempfile.TemporaryDirectory() as out,
    ):
        import torch

        distributed = (lambda roles, config: DistributedRuntime(roles, config.runtime)) if parallel else None
        trainer = build_trainer(workload, 0, out, runtime=distributed)
        gather = Stopwatch()
        if parallel:
            peers = trainer.runtime.peers
            peers.gather_rows = gather.wrap(peers.gather_rows)
        record_shapes(trainer)
        rows = run_iterations(trainer, iters)
        trainer.logger.close()
        steady = rows[warmup:]
        result = {
            "workload": workload.name,
            "ranks": trainer.runtime.peers.world_size if parallel else 1,
            "threads_per_rank": torch.get_num_threads(),
            "iter_s": [round(r["wall"], 4) for r in rows],
            "s_per_iter_median": statistics.median(r["wall"] for r in steady),
            **{f"{p}_s_median": statistics.median(r[p] for r in steady) for p in PHASES},
            "peak_rss_mb": peak_rss_mb(),
        }
        if parallel:
            result["gather_rows_s_per_iter"] = gather.seconds / iters
            if trainer.runtime.peers.rank != 0:
                return {}
    return result


def compare(workload: str, iters: int, reps: int, log=print) -> dict:
    """`reps` alternated pairs of runs: 1 process x 2 threads and 2 ranks x 1 thread."""
    python = sys.executable
    one = [
        python,
        "-m",
        "bench.speed.data_parallel",
        "run",
        "--workload",
        workload,
        "--iters",
        str(iters),
        "--threads",
        "2",
    ]
    two = [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "bench.speed.data_parallel", "run", "--workload", workload, "--iters", str(iters), "--threads", "1",
    ]  # fmt: skip
    runs: dict[str, list[dict]] = {"1x2": [], "2x1": []}
    for rep in range(reps):
        order = [("1x2", one, 2), ("2x1", two, 1)]
        if rep % 2:
            order.reverse()
        for name, cmd, threads in order:
            result = run_case(cmd, env=child_env(threads), cwd=str(REPO), timeout=1800)
            log(
                f"  rep {rep + 1}/{reps} {workload} {name}: {result.get('s_per_iter_median', result.get('error'))}"
            )
            runs[name].append(result)
    return {"workload": workload, "iters": iters, "runs": runs, "summary": summary(runs)}


def summary(runs: dict[str, list[dict]]) -> dict:
    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if key in r]
        return round(statistics.median(values), 4) if values else None

    out = {
        "one_process_2_threads_s_per_iter": median("1x2", "s_per_iter_median"),
        "two_ranks_1_thread_s_per_iter": median("2x1", "s_per_iter_median"),
        "gather_rows_s_per_iter": median("2x1", "gather_rows_s_per_iter"),
    }
    for phase in PHASES:
        out[f"phase_{phase}_s"] = {
            "1x2": median("1x2", f"{phase}_s_median"),
            "2x1": median("2x1", f"{phase}_s_median"),
        }
    one, two = out["one_process_2_threads_s_per_iter"], out["two_ranks_1_thread_s_per_iter"]
    out["two_ranks_speedup"] = round(one / two, 3) if one and two else None
    return out


def print_summary(result: dict) -> None:
    s = result["summary"]
    print(
        f"\nData parallel, {result['workload']} (B=16, L=32): 1 process x 2 threads "
        f"{s['one_process_2_threads_s_per_iter']} s/iter; 2 ranks x 1 thread {s['two_ranks_1_thread_s_per_iter']} "
        f"s/iter (speedup {s['two_ranks_speedup']}x; parity is the most a 2-core machine allows)\n"
        f"   forward-result gathers {s['gather_rows_s_per_iter']} s per iteration\n"
        "   phases 1x2 / 2x1 (s): "
        + ", ".join(f"{p} {s[f'phase_{p}_s']['1x2']}/{s[f'phase_{p}_s']['2x1']}" for p in PHASES)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("run", "compare"))
    parser.add_argument("--workload", default="small-4x4", choices=[w.name for w in WORKLOADS])
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    if args.mode == "run":
        result = run(args.workload, args.iters, args.warmup, args.threads)
        if result:
            emit(result)
        return
    result = compare(args.workload, args.iters, args.reps)
    print_summary(result)
    emit(result)


if __name__ == "__main__":
    main()
