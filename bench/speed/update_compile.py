"""Would compiling the trained models speed up the PPO update? (On an H200 one optimizer
step of SmolLM2's shape takes 0.26-0.38 s with the device busy 12% of it, bound by the host
launching the forward and backward op by op: docs/speed.md "On a GPU".)

Two trainers from one seed run the same iterations: one as it is, one with `train.compile` (the
policy's and critic's decoders compiled whole by `torch.compile` for their forwards with gradients
on, rlhf/models/compiled.py). The sampler and the scoring forwards run uncompiled in both, so both
trainers draw the same rollouts and the update's figures can be compared. The first compiled
iteration pays the compile.

    python -m bench.speed.update_compile --workload smollm2-1x1 --batch-size 32 --response-length 64 --device cuda --dtype bfloat16
    python -m bench.speed.update_compile --workload tiny-1x1 --device cpu --dtype float32 --backend aot_eager  # a quick check

The last stdout line is JSON: per trainer the seconds of each iteration and the medians of its
phases after `--warmup`, the compile's graphs, and the largest difference between the two trainers'
logged figures in the first iteration (float rounding in float32; bf16's own in bf16).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile

import torch

from bench.common import emit, set_threads, timed
from bench.speed.ours import PHASES

# figures that differ between two runs by design (time, throughput), not by their update
UNTIMED = ("time/", "throughput/", "memory/")


def run(trainer, iters: int, device: str) -> tuple[list[dict], dict]:
    """`iters` steps: each one's wall time and phases, and the first one's logged figures."""
    from bench.speed.gpu import synchronize_phase_ends

    synchronize_phase_ends(trainer, device)
    rows, first = [], {}
    for i in range(iters):
        wall, metrics = timed(trainer.step, device)
        trainer.iteration += 1
        rows.append({"wall": round(wall, 4), **{p: round(metrics[f"time/{p}"], 4) for p in PHASES}})
        if i == 0:
            first = {
                k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not k.startswith(UNTIMED)
            }
    return rows, first


def largest_difference(a: dict, b: dict, floor: float = 1e-3) -> dict:
    """Over the figures both hold: the largest |a - b| / max(|a|, |b|, `floor`) (a figure near 0,
    such as PPO's first loss, compared absolutely) and its key, the largest |a - b| and its key, and
    how many figures."""
    worst, where, largest, largest_key = 0.0, "", 0.0, ""
    common = sorted(set(a) & set(b))
    for key in common:
        x, y = float(a[key]), float(b[key])
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y)
        relative = diff / max(abs(x), abs(y), floor)
        if not diff <= largest:
            largest, largest_key = (diff if not math.isnan(diff) else math.inf), key
        if not relative <= worst:  # NaN on one side counts as the worst
            worst, where = relative, key
    return {"relative": worst, "key": where, "absolute": largest, "absolute_key": largest_key,
            "figures_compared": len(common)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="smollm2-1x1")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--response-length", type=int, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--engine", default="cuda_graph", help="the sampler's engine (static on a CPU)")
    parser.add_argument("--iters", type=int, default=5, help="iterations per trainer")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="iterations not counted (the compile, and on CUDA the compiled sampler's)",
    )
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (aot_eager: a check)")
    args = parser.parse_args()
    set_threads(2)
    from bench.speed.gpu import build_trainer, workload_named

    workload = workload_named(args.workload)
    if args.batch_size or args.response_length:
        workload = dataclasses.replace(
            workload,
            batch_size=args.batch_size or workload.batch_size,
            response_length=args.response_length or workload.response_length,
        )
    engine = args.engine if args.device.startswith("cuda") else "static"
    result: dict = {"workload": workload.name, "rollout_BL": [workload.batch_size, workload.response_length],
                    "device": args.device, "dtype": args.dtype, "backend": args.backend}  # fmt: skip
    firsts = []
    for name in ("as_is", "compiled"):
        with tempfile.TemporaryDirectory(prefix=f"update_compile_{name}_") as run_dir:
            compile = {"compile": True, "compile_backend": args.backend} if name == "compiled" else {}
            trainer = build_trainer(
                workload, args.device, args.dtype, 0, run_dir, engine=engine, train=compile
            )
            graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            rows, first = run(trainer, args.iters, args.device)
            trainer.logger.close()
        steady = rows[args.warmup :] or rows
        result[name] = {
            "iter_s": [r["wall"] for r in rows],
            "phases_median_s": {p: statistics.median(r[p] for r in steady) for p in PHASES},
            "first_update_s": rows[0]["update"],
            "graphs_compiled": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before,
        }
        firsts.append(first)
    result["first_iteration_difference"] = largest_difference(*firsts)
    as_is, compiled = (
        result["as_is"]["phases_median_s"]["update"],
        result["compiled"]["phases_median_s"]["update"],
    )
    result["update_speedup"] = round(as_is / compiled, 3) if compiled else None
    emit(result)


if __name__ == "__main__":
    main()
