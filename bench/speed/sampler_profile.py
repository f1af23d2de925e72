"""Where one call of our sampler spends its time: the prefill, the CUDA graph's capture,
and the decode steps, then torch.profiler's busiest ops over a whole call. The question it answers:
is a step bound by the GPU's work, or by the host launching it (the GPU idle between kernels)?

    python -m bench.speed.sampler_profile --shape smollm2 --device cuda --dtype bfloat16 --batch 64 --new-tokens 128

SmolLM2-135M's shape with random weights (bench/speed/sampler.py `shaped_model`), EOS off, temperature
0.7 as in bench/speed/sampler.py. The last stdout line is JSON: seconds of the prefill, of the capture
(the graph engine's warm-up step and capture), of the steps after it, per step, and the share of the
call's wall time the device was busy (the sum of the kernels' self device time over wall time).
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import emit, set_threads, synchronize


def timed_phases(model, ids, mask, config, device: str) -> dict:
    """Seconds of prefill, capture (graph engine) and the whole call, by wrapping the engine's parts."""
    from rlhf.models import decoding
    from rlhf.models.sampling import generate

    marks: dict[str, float] = {}

    def wrap(cls, name: str, label: str):
        original = getattr(cls, name)

        def measured(self, *args, **kwargs):
            synchronize(device)
            start = time.perf_counter()
            out = original(self, *args, **kwargs)
            synchronize(device)
            marks[label] = marks.get(label, 0.0) + time.perf_counter() - start
            return out

        setattr(cls, name, measured)
        return original

    originals = [
        (decoding.EagerSteps, "prefill", wrap(decoding.EagerSteps, "prefill", "prefill")),
        (decoding.CudaGraphSteps, "_capture", wrap(decoding.CudaGraphSteps, "_capture", "capture")),
    ]
    try:
        synchronize(device)
        start = time.perf_counter()
        generate(model, ids, mask, config, 2, 0, torch.Generator(device).manual_seed(0))
        synchronize(device)
        marks["call"] = time.perf_counter() - start
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=["smollm2"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--engine", default="cuda_graph")
    parser.add_argument("--top", type=int, default=15, help="ops listed, by self device time")
    args = parser.parse_args()
    set_threads(2)
    from torch.profiler import ProfilerActivity, profile

    from bench.speed.sampler import random_prompts, shaped_model
    from rlhf.data.collate import left_pad
    from rlhf.models.sampling import SamplingConfig, generate

    _, model = shaped_model(args.shape)
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    ids, mask = left_pad(random_prompts(args.batch, model), 0)
    ids, mask = ids.to(args.device), mask.to(args.device)
    config = SamplingConfig(
        max_new_tokens=args.new_tokens, temperature=0.7, stop_at_eos=False, engine=args.engine
    )
    generate(model, ids, mask, config, 2, 0, torch.Generator(args.device).manual_seed(0))  # warm-up
    marks = timed_phases(model, ids, mask, config, args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        synchronize(args.device)
        start = time.perf_counter()
        generate(model, ids, mask, config, 2, 0, torch.Generator(args.device).manual_seed(1))
        synchronize(args.device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    device_time = (
        "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    )
    busy_us = sum(getattr(e, device_time, 0) for e in events)
    # kernels the device ran (a graph's replayed ones included), per decode step of the call
    kernels = sum(e.count for e in events if str(getattr(e, "device_type", "")).endswith("CUDA"))
    print(events.table(sort_by=device_time if args.device.startswith("cuda") else "self_cpu_time_total",
                       row_limit=args.top), flush=True)  # fmt: skip
    steps_s = marks["call"] - marks.get("prefill", 0.0) - marks.get("capture", 0.0)
    emit({
        "shape": args.shape, "device": args.device, "dtype": args.dtype, "engine": args.engine,
        "batch": args.batch, "new_tokens": args.new_tokens,
        "seconds": {k: round(v, 4) for k, v in marks.items()},
        "per_step_ms": round(1000 * steps_s / max(1, args.new_tokens - 1), 3),
        "tok_per_s": round(args.batch * args.new_tokens / marks["call"], 1),
        "profiled_wall_s": round(wall, 4),
        "device_busy_share": round(busy_us / 1e6 / wall, 3) if args.device.startswith("cuda") else None,
        "kernels_per_step": round(kernels / max(1, args.new_tokens - 1), 1),
    })  # fmt: skip


if __name__ == "__main__":
    main()
