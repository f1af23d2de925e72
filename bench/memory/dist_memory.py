"""Memory per rank of `rlhf train` under torchrun: the largest rank's peak above the interpreter, at
1 and 2 ranks, for each `dist.strategy`, the seconds of the run and of each
iteration (`time/iteration` of metrics.jsonl; the first iteration also shards or wraps the models).

    .venv/bin/python -m bench.memory.dist_memory compare --workload m84 --ranks 1 2 --strategies ddp fsdp2
    .venv/bin/python -m bench.memory.dist_memory compare --workload m84 --ranks 1 --strategies fsdp2 --device cuda
    .venv/bin/python -m bench.memory.dist_memory compare --ranks 2 --strategies fsdp2 fsdp2+per_layer --malloc live
    .venv/bin/python -m bench.memory.dist_memory compare --stage sft --workload m512 --ranks 1 2 --strategies fsdp2
    # fsdp2's gradient reduction once per optimizer step against after every micro-batch, 2 micro-
    # batches per rank and step; ddp (DistributedDataParallel) against an older checkout's rlhf
    .venv/bin/python -m bench.memory.dist_memory compare --ranks 2 --strategies fsdp2:micro_batch fsdp2:step \
        --micro-batch 1 --iterations 2
    .venv/bin/python -m bench.memory.dist_memory compare --ranks 2 --strategies ddp --iterations 2 --rlhf OLD/rlhf

    # a real Hugging Face model (SmolLM2-135M, float32) against `rlhf plan`'s prediction, 1 and 2 ranks
    .venv/bin/python -m bench.memory.dist_memory compare --workload smollm2-hf --ranks 1 2 --strategies fsdp2 \
        --malloc live --hf-model bench/.cache/smollm2/hf-float32

A strategy `fsdp2:step` runs `--dist.strategy fsdp2 --dist.grad_sync step`. `--rlhf DIR` runs the
`rlhf` package in DIR (e.g. `git archive COMMIT rlhf | tar -x -C OLD`) instead of this checkout's.

A strategy `S+G` runs `--dist.strategy S --dist.rollout_gather G` (the rollout's policy whole or per
layer); both combine: `fsdp2:step+per_layer`.

The workload: PPO-max with a separate critic (from the reward model), a frozen reference and
reward model, all four of the same shape (bench/memory/gpu_memory.py's `m84`: hidden 1024, 8 layers, 92M
parameters each); one iteration, 8 rollouts x 8 new tokens, 2 minibatches, no critic pre-training.
`--stage sft`: `rlhf sft` of the policy instead, 4 optimizer steps of 16 rows (micro-batches of 4,
prompts and responses of 8 to 16 words) and a held-out evaluation of 6 rows before and after.
Each rank measures its own peak resident memory (ru_maxrss) and, before any work, the interpreter's
(torch, transformers and rlhf imported); on a GPU also `torch.cuda.max_memory_allocated`; and each
rollout's seconds and peak resident memory above the resident set before it, fsdp2's sharding at
the first use done before (`watch_rollouts`). `--workload smollm2-hf`: the same PPO-max iteration on a real model directory (`--hf-model`, SmolLM2-135M in
float32: policy, critic, reference and a reward model made of it with a fresh scalar head; the prompts
bench/speed/smollm2.py's 8 questions in the chat template). Every case of a `compare` also carries `rlhf
plan`'s prediction for it (`plan_mib`, `plan_ratio`: measured over predicted; float32 on the CPU;
the prompt length the prompts' longest). The one
process reference is `--ranks 1 --strategies none` (every case runs it first). The last stdout
line is JSON.

`--malloc live` sets MALLOC_MMAP_THRESHOLD_=131072 for every process: glibc then maps every large
tensor on its own and unmaps it when freed, so the resident set follows the live tensors (the
default, `runtime.keep_freed_memory`, keeps freed blocks for reuse: faster on a CPU, but the peak
resident set then also counts the heap's fragments).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import emit, peak_rss_mb  # noqa: E402

TAG = "DIST_MEMORY "


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def status_mib(key: str) -> float:
    """A VmRSS/VmHWM line of /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def watch_rollouts(rollouts: list[dict]) -> None:
    """Each rollout's seconds and peak resident memory above the resident set before it (the kernel's
    high-water mark, reset before the rollout through /proc/self/clear_refs), appended to `rollouts`."""
    from rlhf.runtime.distributed import DistributedRuntime
    from rlhf.runtime.local import LocalRuntime

    for cls in (LocalRuntime, DistributedRuntime):

        def generate(self, *args, _inner=cls.generate, **kwargs):
            if hasattr(self, "shard_roles"):
                self.shard_roles()  # fsdp2, at the first use: the roles cut into shards, not counted
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident set
            before, start = status_mib("VmRSS"), time.perf_counter()
            rollout = _inner(self, *args, **kwargs)
            seconds = time.perf_counter() - start
            rollouts.append({"seconds": seconds, "peak_above_before_mib": status_mib("VmHWM") - before})
            return rollout

        cls.generate = generate


def sft_args(models: Path, out: Path, device: str) -> list[str]:
    """`rlhf sft`'s arguments for the `--stage sft` workload."""
    return ["sft", "--model", str(models / "policy"), "--data", str(models / "sft.jsonl"), "--out", str(out),
            "--train.device", device, "--train.max_steps", "4", "--train.batch_size", "16",
            "--train.micro_batch_size", "4", "--data.test_fraction", "0.1"]  # fmt: skip


def rank_main(
    models: Path,
    strategy: str,
    device: str,
    out: Path,
    micro_batch: int,
    iterations: int,
    stage: str = "train",
) -> None:
    """One rank (or the one process): `rlhf train` in this process, then its memory as a tagged line."""
    import torch
    import transformers  # noqa: F401

    from rlhf.cli import main

    interpreter = current_rss_mb()
    rollouts: list[dict] = []
    watch_rollouts(rollouts)
    args = ["train", "--preset", "ppo_max", "--policy", str(models / "policy"), "--reward-model",
            str(models / "rm"), "--prompts", str(models / "prompts.jsonl"), "--out", str(out),
            "--train.device", device, "--train.iterations", str(iterations), "--rollout.batch_size", "8",
            "--rollout.max_new_tokens", "8", "--train.minibatches", "2", "--critic.pretrain_iterations", "0",
            "--train.micro_batch_size", str(micro_batch), "--checkpoint.every", "0"]  # fmt: skip
    if stage == "sft":
        args = sft_args(models, out, device)
    strategy, _, gather = strategy.partition("+")  # fsdp2+per_layer: dist.rollout_gather per_layer
    if strategy != "none":
        name, _, grad_sync = strategy.partition(":")
        args += ["--dist.strategy", name] + (["--dist.grad_sync", grad_sync] if grad_sync else [])
    if gather:
        args += ["--dist.rollout_gather", gather]
    if device == "cuda":
        args += ["--dtype", "bfloat16"]
    start = time.perf_counter()
    code = main(args)
    result = {
        "rank": int(os.environ.get("RANK", "0")),
        "exit": code,
        "seconds": time.perf_counter() - start,
        "interpreter_mib": interpreter,
        "peak_rss_mib": peak_rss_mb(),
        "rollouts": rollouts,
        "iteration_s": iteration_seconds(out)
        if int(os.environ.get("RANK", "0")) == 0 and stage == "train"
        else [],
    }
    if device == "cuda":
        result["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(TAG + json.dumps(result), flush=True)


def iteration_seconds(out: Path) -> list[float]:
    """`time/iteration` of each iteration in the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [round(row["time/iteration"], 2) for row in rows if "time/iteration" in row]


@dataclass
class Case:
    """What every case of one comparison shares beyond its strategy and ranks."""

    models: Path
    device: str
    work: Path
    malloc: str
    micro_batch: int
    iterations: int
    rlhf: Path | None  # another checkout's rlhf package, or None: this one's
    stage: str = "train"  # or "sft"


def run_case(case: Case, ranks: int, strategy: str) -> dict:
    out = (
        case.work / f"run_{strategy.replace(':', '_')}_{ranks}_{len(list(case.work.glob('run_*')))}"
    )  # a case may repeat
    me = [sys.executable, "-m", "bench.memory.dist_memory", "rank", "--models", str(case.models), "--strategy", strategy,
          "--device", case.device, "--out", str(out), "--micro-batch", str(case.micro_batch),
          "--iterations", str(case.iterations), "--stage", case.stage]  # fmt: skip
    if ranks > 1 or strategy != "none":
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
        me = torchrun + me[1:]
    cwd = REPO  # `python -m` puts the working directory first on the path: its rlhf is the one run
    if case.rlhf is not None:  # a directory holding only a link to that rlhf (bench/ from PYTHONPATH)
        cwd = case.work / "other"
        cwd.mkdir(exist_ok=True)
        if not (cwd / "rlhf").exists():
            (cwd / "rlhf").symlink_to(case.rlhf.resolve())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if case.malloc == "live":
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run(me, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    per_rank = [json.loads(line[len(TAG) :]) for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if proc.returncode != 0 or len(per_rank) != ranks:
        raise SystemExit(f"{strategy} x{ranks} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    above = [r["peak_rss_mib"] - r["interpreter_mib"] for r in per_rank]
    result = {
        "strategy": strategy,
        "ranks": ranks,
        "largest_rank_peak_above_interpreter_mib": round(max(above), 1),
        "seconds": round(max(r["seconds"] for r in per_rank), 1),
        "iteration_s": next(r["iteration_s"] for r in per_rank if r["rank"] == 0),  # rank 0 writes them
        "per_rank": per_rank,
    }
    if per_rank[0]["rollouts"]:  # rlhf train
        result["rollout_seconds"] = round(max(sum(x["seconds"] for x in r["rollouts"]) for r in per_rank), 2)
        result["largest_rank_rollout_peak_above_before_mib"] = round(
            max(x["peak_above_before_mib"] for r in per_rank for x in r["rollouts"]), 1
        )
    if case.device == "cuda":
        result["largest_rank_cuda_peak_mib"] = round(max(r["cuda_peak_allocated_mib"] for r in per_rank), 1)
    return result


HF_WORKLOAD = (
    "smollm2-hf"  # a real model directory (--hf-model) instead of a bench/memory/gpu_memory.py shape
)


def write_hf_workload(model_dir: Path, out: Path) -> None:
    """`smollm2-hf`: `model_dir` (a Hugging Face causal LM) as the policy, a reward model of it with a
    fresh scalar head (rlhf.models.scalar_head, seed 0), bench/speed/smollm2.py's 8 questions as prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.speed.smollm2 import QUESTIONS
    from rlhf.models.scalar_head import ScalarHeadModel

    out.mkdir(parents=True)
    (out / "policy").symlink_to(model_dir.resolve())
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ScalarHeadModel.from_causal_lm(lm).save_pretrained(out / "rm")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out / "rm")
    with open(out / "prompts.jsonl", "w") as f:
        for question in QUESTIONS:
            f.write(json.dumps({"prompt": question}) + "\n")


def longest_prompt_tokens(models: Path) -> int:
    """The prompts' longest length in tokens as `rlhf train` encodes them (chat template and all)."""
    from transformers import AutoTokenizer

    from rlhf.stages.prompt_files import encode_prompts

    tokenizer = AutoTokenizer.from_pretrained(models / "policy")
    ids = encode_prompts(tokenizer, str(models / "prompts.jsonl"), format="auto", max_tokens=10**6,
                         skip_invalid=False)  # fmt: skip
    return max(len(row) for row in ids)


def plan_mib(models: Path, ranks: int, strategy: str, micro_batch: int, prompt_tokens: int) -> float:
    """`rlhf plan`'s per-rank peak for a case of the train workload, float32 on the CPU, in MiB."""
    from rlhf.planner.memory_plan import Job, plan, shape_of

    name, _, gather = strategy.partition("+")
    name = name.partition(":")[0]
    # one process (torchrun at 1 rank too) on this CPU's 2 cores steps the policy and critic side by side
    job = Job(shape_of(str(models / "policy")), strategy=name, ranks=ranks, dtype="float32",
              micro_batch=micro_batch, rollout_rows=8, prompt_tokens=prompt_tokens, response_tokens=8,
              rollout_gather=gather or "whole", overlap_critic=ranks == 1)  # fmt: skip
    return plan(job).per_rank_peak_bytes / 2**20


def compare(
    workload: str, ranks: list[int], strategies: list[str], options: dict, one_process: bool = True,
    hf_model: Path | None = None,
) -> dict:  # fmt: skip
    from bench.memory.gpu_models import write

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if workload == HF_WORKLOAD:
            write_hf_workload(hf_model, work / "models")
        else:
            write(workload, work / "models")
        setup = Case(work / "models", work=work, **options)
        prompt_tokens = longest_prompt_tokens(work / "models") if options["stage"] == "train" else 0
        cases = []
        if one_process:
            one = run_case(Case(**{**vars(setup), "rlhf": None}), 1, "none")  # this checkout's one process
            add_plan(one, setup, prompt_tokens)
            print(f"1 process: {one['largest_rank_peak_above_interpreter_mib']} MiB above the interpreter, "
                  f"{one['seconds']} s, iterations {one['iteration_s']} s", flush=True)  # fmt: skip
            cases.append(one)
        for strategy in strategies:
            for n in ranks:
                case = run_case(setup, n, strategy)
                add_plan(case, setup, prompt_tokens)
                if one_process:
                    peak = case["largest_rank_peak_above_interpreter_mib"]
                    case["of_one_process"] = round(peak / one["largest_rank_peak_above_interpreter_mib"], 3)
                rollout = ""
                if "rollout_seconds" in case:
                    rollout = (f"; the rollout: {case['largest_rank_rollout_peak_above_before_mib']} MiB above "
                               f"the resident set before it, {case['rollout_seconds']} s")  # fmt: skip
                print(f"{strategy} x{n}: {case['largest_rank_peak_above_interpreter_mib']} MiB "
                      f"({case.get('of_one_process')} of one process; plan {case.get('plan_mib')} MiB, "
                      f"measured/plan {case.get('plan_ratio')}), {case['seconds']} s, "
                      f"iterations {case['iteration_s']} s{rollout}", flush=True)  # fmt: skip
                cases.append(case)
    shown = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    return {"workload": workload, **shown, "prompt_tokens": prompt_tokens, "cases": cases}


def add_plan(case: dict, setup: Case, prompt_tokens: int) -> None:
    """`rlhf plan`'s prediction of an `rlhf train` case on the CPU beside its measured peak."""
    if setup.stage != "train" or setup.device != "cpu":
        return
    predicted = plan_mib(setup.models, case["ranks"], case["strategy"], setup.micro_batch, prompt_tokens)
    case["plan_mib"] = round(predicted, 1)
    case["plan_ratio"] = round(case["largest_rank_peak_above_interpreter_mib"] / predicted, 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--workload", default="m84")
    c.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    c.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"])
    c.add_argument("--device", default="cpu")
    c.add_argument("--malloc", choices=["default", "live"], default="default")
    c.add_argument(
        "--rlhf", type=Path, default=None, help="the rlhf package to run (default: this checkout's)"
    )
    c.add_argument("--no-one-process", action="store_true", help="skip the one-process reference run")
    c.add_argument("--stage", choices=["train", "sft"], default="train")
    c.add_argument("--hf-model", type=Path, default=REPO / "bench" / ".cache" / "smollm2" / "hf-float32",
                   help=f"--workload {HF_WORKLOAD}: the model directory")  # fmt: skip
    r = sub.add_parser("rank")
    r.add_argument("--models", type=Path, required=True)
    r.add_argument("--strategy", required=True)
    r.add_argument("--device", default="cpu")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--stage", choices=["train", "sft"], default="train")
    for p in (c, r):
        p.add_argument("--micro-batch", type=int, default=4, help="train.micro_batch_size")
        p.add_argument("--iterations", type=int, default=1, help="train.iterations")
    args = parser.parse_args()
    if args.mode == "rank":
        rank_main(
            args.models, args.strategy, args.device, args.out, args.micro_batch, args.iterations, args.stage
        )
    else:
        options = {"device": args.device, "malloc": args.malloc, "micro_batch": args.micro_batch,
                   "iterations": args.iterations, "rlhf": args.rlhf, "stage": args.stage}  # fmt: skip
        emit(compare(args.workload, args.ranks, args.strategies, options, not args.no_one_process,
                     args.hf_model))  # fmt: skip


if __name__ == "__main__":
    main()
