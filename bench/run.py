"""`make bench`: our PPO iteration against TRL's PPOTrainer, against the machine's FLOP rate, and on
a real 135M model, in one run; then, when CUDA is present, the same on the GPU (bench/speed/gpu.py).
Prints a table and writes bench/results/make_bench.json.

    .venv/bin/python bench/run.py                  # everything (about 10 minutes on 2 cores)
    .venv/bin/python bench/run.py --quick          # one repetition, fewer iterations
    .venv/bin/python bench/run.py --skip-trl --skip-smollm2
    .venv/bin/python bench/run.py --only vs_trl    # sections: vs_trl, smollm2, data_parallel, gpu (+ the matmul rate)

Every case runs in its own subprocess (its peak RSS comes from wait4); ours and TRL's alternate
within each repetition so that both see the same machine load. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repo root
    sys.path.insert(0, str(REPO))

from bench.common import child_env, run_case  # noqa: E402
from bench.speed import data_parallel, gpu, peer, smollm2  # noqa: E402
from bench.speed.report import print_report, summarize  # noqa: E402
from bench.speed.workload import WORKLOADS  # noqa: E402

SECTIONS = ("vs_trl", "smollm2", "data_parallel", "gpu")
CACHE = REPO / "bench" / ".cache"
RESULTS = REPO / "bench" / "results" / "make_bench.json"
CASE_TIMEOUT = 1800.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="one repetition and fewer iterations (a smoke run)"
    )
    parser.add_argument(
        "--skip-trl", action="store_true", help="no TRL peer runs (ours still runs, for FLOP/s)"
    )
    parser.add_argument("--skip-smollm2", action="store_true", help="no SmolLM2-135M section (nor GPU cases)")
    parser.add_argument(
        "--skip-gpu", action="store_true", help="no GPU section (it runs only with CUDA anyway)"
    )
    parser.add_argument(
        "--skip-data-parallel",
        action="store_true",
        help="no 2 ranks x 1 thread vs 1 process x 2 threads section",
    )
    parser.add_argument("--only", choices=SECTIONS, help="run only this section (and the matmul rate)")
    parser.add_argument(
        "--reps", type=int, help="alternated repetitions of each workload (default 3, quick 1)"
    )
    parser.add_argument(
        "--iters", type=int, help="PPO iterations per run, first one warm-up (default 6, quick 4)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads of every case")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.iters = args.iters or (4 if args.quick else 6)
    if args.iters < 2:
        parser.error("--iters must be >= 2 (the first iteration is warm-up)")
    return args


class Runner:
    """Runs cases as subprocesses, logging progress and the load average around each."""

    def __init__(self, threads: int):
        self.env = child_env(threads)
        self.python = sys.executable
        self.load_samples: list[float] = []
        self.started = time.perf_counter()

    def run(self, label: str, cmd: list[str]) -> dict:
        self.load_samples.append(os.getloadavg()[0])
        print(f"  [{time.perf_counter() - self.started:6.0f}s] {label} ...", end="", flush=True)
        result = run_case(cmd, env=self.env, cwd=str(REPO), timeout=CASE_TIMEOUT)
        self.load_samples.append(os.getloadavg()[0])
        if "error" in result:
            print(f" FAILED ({result['wall_s']}s)\n{result['error']}", flush=True)
        else:
            print(f" {result['wall_s']}s, load {self.load_samples[-1]:.1f}", flush=True)
        return result

    def module(self, name: str, *args: str) -> list[str]:
        return [self.python, "-m", name, *args]


def machine_section(runner: Runner, threads: int, reps: int) -> dict:
    return runner.run(
        f"fp32 matmul 2048^2 x{reps}",
        runner.module(
            "bench.speed.machine", "--size", "2048", "--reps", str(reps), "--threads", str(threads)
        ),
    )


def vs_trl_section(runner: Runner, args: argparse.Namespace) -> dict:
    """Each repetition runs every workload with ours and TRL's, alternating which goes first."""
    trl_python, why = (
        (None, "--skip-trl") if args.skip_trl else peer.ensure_venv(REPO, CACHE / "trl_setup.log")
    )
    if trl_python is None:
        print(f"  TRL comparison skipped: {why}", flush=True)
    runs: dict[str, dict[str, list[dict]]] = {w.name: {"ours": [], "trl": []} for w in WORKLOADS}
    for rep in range(args.reps):
        for w in WORKLOADS:
            ours_cmd = runner.module(
                "bench.speed.ours",
                "--workload",
                w.name,
                "--iters",
                str(args.iters),
                "--threads",
                str(args.threads),
            )
            order = [("ours", ours_cmd)]
            if trl_python is not None:
                trl_cmd = peer.trl_command(trl_python, REPO, w, args.iters, 1, args.threads)
                order.append(("trl", trl_cmd))
                if rep % 2:
                    order.reverse()
            for side, cmd in order:
                runs[w.name][side].append(runner.run(f"rep {rep + 1}/{args.reps} {w.name:<9} {side}", cmd))
    return {"runs": runs, "trl_skipped": why if trl_python is None else None}


def smollm2_model(runner: Runner) -> tuple[Path | None, Path | None, str]:
    """(the .gguf, its float32 directory, "") of SmolLM2, fetching and converting once; or
    (gguf or None, None, why it is unavailable)."""
    gguf, why = smollm2.ensure_gguf(CACHE / "smollm2", runner.python)
    if gguf is None:
        return None, None, why
    model_dir = gguf.parent / "hf-float32"
    if not model_dir.is_dir():
        converted = runner.run(
            "SmolLM2 GGUF -> float32 directory (once)",
            runner.module("bench.speed.smollm2", "convert", "--model", str(gguf), "--out", str(model_dir)),
        )
        if "error" in converted:
            return gguf, None, "conversion failed: " + converted["error"]
    return gguf, model_dir, ""


def smollm2_section(runner: Runner, args: argparse.Namespace) -> dict:
    gguf, model_dir, why = smollm2_model(runner)
    if model_dir is None:
        print(f"  SmolLM2 section skipped: {why}", flush=True)
        return {"skipped": why}
    common = ["--model", str(model_dir), "--threads", str(args.threads)]
    sampler = runner.run(
        "SmolLM2 sampler vs generate",
        runner.module("bench.speed.smollm2", "sampler", *common, "--reps", "1" if args.quick else "3"),
    )
    ppo = runner.run(
        "SmolLM2 PPO-max iteration (LoRA)",
        runner.module(
            "bench.speed.smollm2", "ppo", *common, "--iters", "2", "--batch", "8", "--new-tokens", "64"
        ),
    )
    return {"gguf": str(gguf.relative_to(REPO)), "sampler": sampler, "ppo": ppo}


def gpu_section(runner: Runner, args: argparse.Namespace) -> dict:
    """On a CUDA machine: our PPO iteration on every workload (the CPU ones and SmolLM2's) in each
    of gpu.DTYPES, and our sampler against `generate` on SmolLM2, each case in its own process.
    TRL's PPOTrainer is not run: the peer script pins the CPU (bench/speed/peer.py gpu_blockers lists
    how; the section prints it) and it is not ours to edit."""
    info = runner.run("CUDA device check", runner.module("bench.speed.gpu", "info"))
    if "error" in info:
        return {"skipped": "the CUDA check failed: " + info["error"]}
    if not info["cuda"]:  # the report prints the one line saying so
        return {"skipped": info["reason"]}
    blockers = peer.gpu_blockers(REPO)
    trl_skipped = (
        "the peer script cannot run on a GPU as it is: " + "; ".join(blockers)
        if blockers
        else "the peer script no longer pins the CPU, but bench/run.py does not drive it on a GPU yet"
    )
    print(f"  TRL not run on the GPU ({trl_skipped}); ours alone", flush=True)
    workloads = [w.name for w in WORKLOADS]
    model_dir, smollm2_skipped = None, None
    if not args.skip_smollm2:
        _, model_dir, why = smollm2_model(runner)
        if model_dir is None:
            smollm2_skipped = why
            print(f"  GPU SmolLM2 cases skipped: {why}", flush=True)
        else:
            workloads += [w.name for w in gpu.SMOLLM2_WORKLOADS]
    model = ["--model", str(model_dir)] if model_dir is not None else []
    device = "cuda"
    common = ["--device", device, "--threads", str(args.threads)]
    ppo = []
    for name in workloads:
        for dtype in gpu.DTYPES:
            case = ["--workload", name, "--dtype", dtype, "--iters", str(args.iters), *common]
            case += model if name.startswith("smollm2") else []
            result = runner.run(f"GPU {name:<11} {dtype}", runner.module("bench.speed.gpu", "ppo", *case))
            ppo.append({"workload": name, "dtype": dtype, **result})
    sampler = []
    for dtype in gpu.DTYPES if model_dir is not None else ():
        case = ["--dtype", dtype, "--reps", "1" if args.quick else "3", *common, *model]
        result = runner.run(
            f"GPU SmolLM2 sampler vs generate {dtype}", runner.module("bench.speed.gpu", "sampler", *case)
        )
        sampler.append({"dtype": dtype, **result})
    return {
        "device": device,
        "info": info,
        "trl_skipped": trl_skipped,
        "smollm2_skipped": smollm2_skipped,
        "ppo": ppo,
        "sampler": sampler,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skipped = {"smollm2": args.skip_smollm2, "gpu": args.skip_gpu, "data_parallel": args.skip_data_parallel}
    sections = [args.only] if args.only else [s for s in SECTIONS if not skipped.get(s)]
    runner = Runner(args.threads)
    started = dt.datetime.now().astimezone()
    print(
        f"rlhf bench: sections {', '.join(sections)}; {args.reps} repetition(s), {args.iters} iterations per run"
    )
    raw: dict = {"machine": [machine_section(runner, args.threads, 10)]}
    if "vs_trl" in sections:
        raw["vs_trl"] = vs_trl_section(runner, args)
    if "smollm2" in sections:
        raw["smollm2"] = smollm2_section(runner, args)
    if "data_parallel" in sections:  # torchrun: 2 ranks x 1 thread vs 1 process x 2 threads (small-4x4)
        raw["data_parallel"] = data_parallel.compare("small-4x4", args.iters, 1 if args.quick else 2)
    raw["machine"].append(machine_section(runner, args.threads, 10))
    if "gpu" in sections:  # after the CPU measurements, which it would otherwise disturb
        raw["gpu"] = gpu_section(runner, args)
    meta = {
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(
            [Path(sys.executable).name, "bench/run.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "threads": args.threads,
        "cores": os.cpu_count(),
        "reps": args.reps,
        "iters_per_run": args.iters,
        "total_s": round(time.perf_counter() - runner.started, 1),
        "load_average_1min": {
            "mean": round(statistics.fmean(runner.load_samples), 2),
            "min": round(min(runner.load_samples), 2),
            "max": round(max(runner.load_samples), 2),
        },
    }
    results = summarize(raw, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print_report(results)
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
