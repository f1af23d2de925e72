"""Where the PPO update's time goes: torch.profiler over one iteration's `update` of
bench/speed/gpu.py's trainer, its busiest ops by device time and by host time, and the share of the
update the device was busy. On an H200 an optimizer step of policy and critic (SmolLM2's shape, 8
rows) took 0.25 s whatever the rows and the dtype: this says whether that is kernels or the host.

    python -m bench.speed.update_profile --workload smollm2-4x4 --batch-size 32 --response-length 64 --device cuda

The last stdout line is JSON: the update's seconds, its optimizer steps, the device's busy share, and
the top ops (name, calls, host ms, device ms).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

from bench.common import emit, set_threads, synchronize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="smollm2-4x4")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    set_threads(2)
    from torch.profiler import ProfilerActivity, profile

    from bench.speed.gpu import build_trainer, workload_named

    workload = dataclasses.replace(
        workload_named(args.workload), batch_size=args.batch_size, response_length=args.response_length
    )
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="update_profile_") as run_dir:
        trainer = build_trainer(workload, args.device, args.dtype, 0, run_dir)
        trainer.step()  # warm-up: allocator, kernels, the sampler's compile or capture
        trainer.iteration += 1
        original = trainer.update
        seconds: list[float] = []
        prof_holder: list = []

        def profiled_update(*a, **k):
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=activities) as prof:
                synchronize(args.device)
                start = time.perf_counter()
                out = original(*a, **k)
                synchronize(args.device)
                seconds.append(time.perf_counter() - start)
            prof_holder.append(prof)
            return out

        trainer.update = profiled_update
        trainer.step()
        trainer.logger.close()
    events = prof_holder[0].key_averages()
    device_attr = (
        "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    )
    busy_s = sum(getattr(e, device_attr, 0) for e in events) / 1e6
    for sort in ([device_attr] if cuda else []) + ["self_cpu_time_total"]:
        print(events.table(sort_by=sort, row_limit=args.top), flush=True)
    top = sorted(
        events, key=lambda e: getattr(e, device_attr if cuda else "self_cpu_time_total"), reverse=True
    )
    emit({
        "workload": workload.name, "rollout_BL": [workload.batch_size, workload.response_length],
        "device": args.device, "dtype": args.dtype, "update_s": round(seconds[0], 4),
        "optimizer_steps": workload.ppo_epochs * workload.minibatches,
        "device_busy_share": round(busy_s / seconds[0], 3) if cuda else None,
        "top": [
            {"name": e.key[:80], "calls": e.count, "host_ms": round(e.self_cpu_time_total / 1e3, 2),
             "device_ms": round(getattr(e, device_attr, 0) / 1e3, 2)}
            for e in top[: args.top]
        ],
    })  # fmt: skip


if __name__ == "__main__":
    main()
