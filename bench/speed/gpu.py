"""The GPU section of `make bench`: our PPO iteration and our sampler on a device, in a dtype.

Every function takes the device ("cuda", "cuda:N" or "cpu") and the precision policy (`dtype`:
"float32" | "bfloat16" | "bfloat16-pure"), so the same code runs on the CPU in the tests and on a
GPU in `make bench`. Timed regions wait for the device at both ends, and so does each of the
trainer's phase boundaries (bench/common.py); the first `warmup` iterations are not counted.

Subprocess cases (the last stdout line is JSON), run by bench/run.py when CUDA is present:

    .venv/bin/python -m bench.speed.gpu info                                   # CUDA present? its matmul rates
    .venv/bin/python -m bench.speed.gpu ppo --workload small-4x4 --device cuda --dtype bfloat16
    .venv/bin/python -m bench.speed.gpu ppo --workload smollm2-1x1 --model DIR --device cuda --dtype bfloat16
    .venv/bin/python -m bench.speed.gpu ppo --workload smollm2-1x1 --batch-size 32 --response-length 64  # random weights
    .venv/bin/python -m bench.speed.gpu sampler --model DIR --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
from pathlib import Path

import torch

from bench.common import emit, peak_memory, reset_peak_memory, set_threads, synchronized_after
from bench.speed.ours import PHASES, phase_flops, record_shapes, run_iterations, summarize
from bench.speed.workload import WORKLOADS, Workload

DTYPES = ("float32", "bfloat16")
# The peer workload's rollout shape and schedules on SmolLM2-135M-Instruct (needs --model DIR).
SMOLLM2_WORKLOADS = (Workload("smollm2", 1, 1), Workload("smollm2", 4, 4))
ALL_WORKLOADS = WORKLOADS + SMOLLM2_WORKLOADS
MATMUL_SIZE = 4096


def device_info() -> dict:
    """{"cuda": False, "reason"} without CUDA, else the device's name, memory, capability, bf16
    support and versions."""
    if not torch.cuda.is_available():
        return {
            "cuda": False,
            "reason": f"no CUDA device (torch.cuda.is_available() is False; torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'})",
        }
    props = torch.cuda.get_device_properties(0)
    return {
        "cuda": True,
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_mb": round(props.total_memory / 2**20),
        "devices": torch.cuda.device_count(),
        "bf16": torch.cuda.is_bf16_supported(),
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
    }


def matmul_rates(device: str, dtypes=DTYPES, size: int = MATMUL_SIZE, reps: int = 10) -> dict:
    """Best GFLOP/s of a [size, size] matmul per dtype on `device` (the phases' FLOP ceiling)."""
    from bench.speed.machine import matmul_rates as rates

    return {dtype: round(max(rates(size, reps, device=device, dtype=dtype)), 1) for dtype in dtypes}


# -- one PPO iteration ---------------------------------------------------------------------------


def workload_named(name: str) -> Workload:
    found = [w for w in ALL_WORKLOADS if w.name == name]
    if not found:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(w.name for w in ALL_WORKLOADS)}")
    return found[0]


def build_trainer(
    workload: Workload,
    device: str,
    dtype: str,
    seed: int,
    run_dir: str,
    model_dir=None,
    engine: str = "auto",
    train: dict | None = None,
):
    """bench/speed/ours.py's trainer on `device` in precision `dtype`; SmolLM2 workloads load the policy
    from `model_dir` (the reward model and critic start from copies of it), or without one build
    SmolLM2-135M's shape with random weights and the peer workload's word prompts (a GPU machine
    without the weights: EOS never stops a response, so the work is the trained model's). `train`:
    more settings of the train group (`{"compile": True}`)."""
    from bench.speed import ours

    extra = {"train": {"device": device, **(train or {})}, "dtype": dtype, "rollout": {"engine": engine}}
    if workload.size != "smollm2":
        return ours.build_trainer(workload, seed, run_dir, extra)
    if model_dir is None:
        from bench.memory.gpu_memory import shaped_models

        tokenizer, prompts, policy, reward_lm = shaped_models("smollm2", seed)
        return ours.trainer_on(workload, tokenizer, prompts, policy, reward_lm, seed, run_dir, extra)
    from bench.speed import smollm2

    tokenizer, policy = smollm2.load(Path(model_dir))
    prompts = smollm2.chat_prompts(tokenizer, 64)
    return ours.trainer_on(workload, tokenizer, prompts, policy, copy.deepcopy(policy), seed, run_dir, extra)


def synchronize_phase_ends(trainer, device: str) -> None:
    """Each call that ends one of the trainer's timed phases waits for the device before returning,
    so the phase times (`time/generate|score|forward|update`) hold the work queued in the phase."""
    roles = trainer.runtime.roles
    synchronized_after(roles.policy, "generate", device)  # ends `generate`
    synchronized_after(roles.reward_model, "score", device)  # ends `score`
    synchronized_after(roles.critic, "values", device)  # the last no-grad forward: ends `forward`
    synchronized_after(trainer, "update", device)  # ends `update`


def ppo_iteration(
    workload: Workload,
    device: str,
    dtype: str,
    *,
    iters: int = 6,
    warmup: int = 1,
    seed: int = 0,
    model_dir: str | Path | None = None,
    engine: str = "auto",
    compile: bool = False,
) -> dict:
    """`iters` PPO iterations of `workload` on `device` in `dtype`: medians over the iterations after
    `warmup` of seconds per iteration and of each phase (`other` = the rest of the iteration:
    advantages, metrics), FLOPs per phase, and peak memory over the iterations (CUDA: allocated
    tensors, weights included; CPU: the process's peak RSS). `compile`: `train.compile` (the update's
    forwards compiled by inductor; its first iterations pay the compile: raise `warmup`)."""
    if not 0 <= warmup < iters:
        raise ValueError(f"iters ({iters}) must exceed warmup ({warmup}): the first `warmup` are not counted")
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as run_dir:
        train = {"compile": True} if compile else None
        trainer = build_trainer(workload, device, dtype, seed, run_dir, model_dir, engine, train)
        record_shapes(trainer)
        synchronize_phase_ends(trainer, device)
        reset_peak_memory(device)
        rows = run_iterations(trainer, iters, device)
        memory = peak_memory(device)
        trainer.logger.close()
    for row in rows:
        row["flops"] = phase_flops(trainer, row["shape"], workload.ppo_epochs)
        row["other"] = row["wall"] - sum(row[p] for p in PHASES)
    steady = rows[warmup:]
    stats = summarize(rows, warmup)
    return {
        "workload": workload.name,
        "rollout_BL": [workload.batch_size, workload.response_length],
        "rollout_engine": engine,
        "train_compile": compile,
        "weights": str(model_dir)
        if model_dir
        else ("random" if workload.size == "smollm2" else "random (peer shape)"),
        "device": str(trainer.runtime.device),
        "dtype": dtype,
        "iterations_counted": len(steady),
        "iter_s": stats["iter_s"],
        "s_per_iter_median": round(stats["s_per_iter_median"], 4),
        "phases_s": {p: round(statistics.median(r[p] for r in steady), 4) for p in (*PHASES, "other")},
        "phases_per_iteration_s": [{p: round(r[p], 5) for p in ("wall", *PHASES)} for r in rows],
        "gflop_per_iter": {p: round(stats[f"{p}_gflops"], 3) for p in PHASES},
        "gflop_per_s": {p: round(stats[f"{p}_gflop_per_s"], 2) for p in PHASES},
        "shapes_BPT": [list(r["shape"]) for r in rows],
        "peak_memory_mb": memory["peak_mb"],
        "memory_kind": memory["kind"],
    }


# -- our sampler against transformers' generate -----------------------------------------------


def place(model: torch.nn.Module, device: str, dtype: str) -> torch.nn.Module:
    """`model` moved to `device` with its weights in `dtype` ("float32" | "bfloat16"), in place: both
    samplers then run the same weights, as inference usually does (no autocast)."""
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def batch_of(prompts: list[list[int]], size: int, pad_token_id: int):
    """The first `size` prompts (cycled), left-padded: (ids, mask)."""
    from rlhf.data.collate import left_pad

    return left_pad([prompts[i % len(prompts)] for i in range(size)], pad_token_id)


def greedy_agreement(model, tokenizer, ids, mask, new_tokens: int) -> dict:
    """Greedy responses (EOS on) of our sampler and of `generate` on one batch: are they the same
    tokens? (`rows_differing`: rows whose response differs, `first_step_differing` of the first one)."""
    from bench.speed.smollm2 import hf_generate, ours_generate
    from rlhf.models.sampling import SamplingConfig

    config = SamplingConfig(max_new_tokens=new_tokens, do_sample=False, stop_at_eos=True)
    _, rollout = ours_generate(model, ids, mask, config, tokenizer, 0)
    _, theirs = hf_generate(model, ids, mask, config, tokenizer, 0)
    ours = rollout.response_ids.cpu()
    theirs = theirs.cpu()
    return {"steps": [ours.shape[1], theirs.shape[1]], **token_differences(ours, theirs)}


def token_differences(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Compare two [B, T] response-id tensors (widths may differ: a missing column counts as a
    difference): {"equal", "rows_differing", "first_step_differing"}."""
    width = max(ours.shape[1], theirs.shape[1])
    a = torch.full((ours.shape[0], width), -1, dtype=torch.long)
    b = a.clone()
    a[:, : ours.shape[1]] = ours
    b[:, : theirs.shape[1]] = theirs
    differ = a != b
    rows = differ.any(1)
    first = int(differ.any(0).float().argmax()) if bool(rows.any()) else None
    return {"equal": not bool(rows.any()), "rows_differing": int(rows.sum()), "first_step_differing": first}


def sampler_vs_generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    device: str,
    dtype: str,
    batch_sizes=(1, 16),
    *,
    new_tokens: int = 64,
    reps: int = 3,
) -> dict:
    """Our sampler against `generate` on `device` with `dtype` weights (the model is moved there):
    per batch size, `new_tokens` at temperature 0.7 with EOS never stopping a row, after a warm-up
    of both (on CUDA also the calls after which `auto` compiles), `reps` alternated runs
    (bench/speed/smollm2.py's rows: seconds, tokens, speedup); then the greedy check on the largest batch;
    peak memory (CUDA: since the model was placed)."""
    from bench.speed.smollm2 import comparison, time_hf, time_ours
    from rlhf.models.decoding import COMPILE_AFTER_CALLS
    from rlhf.models.sampling import SamplingConfig

    place(model, device, dtype)
    reset_peak_memory(device)
    fixed = SamplingConfig(max_new_tokens=new_tokens, temperature=0.7, stop_at_eos=False)
    warm = SamplingConfig(max_new_tokens=2)
    out: dict = {"device": device, "dtype": dtype, "new_tokens": new_tokens, "reps": reps}
    for size in batch_sizes:
        ids, mask = batch_of(prompts, size, tokenizer.pad_token_id)
        time_ours(model, ids, mask, warm, tokenizer, 0)
        time_hf(model, ids, mask, warm, tokenizer, 0)
        if device.startswith("cuda"):  # `auto` compiles a shape once it repeats: here, not in a timed rep
            for _ in range(COMPILE_AFTER_CALLS + 1):
                time_ours(model, ids, mask, fixed, tokenizer, 0)
        ours, hf = [], []
        for rep in range(reps):  # alternated: both see the same state of the device and host
            ours.append(time_ours(model, ids, mask, fixed, tokenizer, rep))
            hf.append(time_hf(model, ids, mask, fixed, tokenizer, rep))
        out[f"batch{size}"] = comparison(ids, ours, hf)
    ids, mask = batch_of(prompts, max(batch_sizes), tokenizer.pad_token_id)
    out["greedy_tokens"] = greedy_agreement(model, tokenizer, ids, mask, new_tokens)
    memory = peak_memory(device)
    out["peak_memory_mb"], out["memory_kind"] = memory["peak_mb"], memory["kind"]
    return out


# -- subprocess entry point --------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("case", choices=["info", "ppo", "sampler"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | bfloat16-pure (ppo)")
    parser.add_argument("--workload", choices=[w.name for w in ALL_WORKLOADS], help="ppo: the workload")
    parser.add_argument(
        "--model", type=Path, help="the SmolLM2 float32 directory (smollm2 workloads, sampler)"
    )
    parser.add_argument(
        "--iters", type=int, default=6, help="ppo: iterations, the first `--warmup` not counted"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="ppo: prompts per iteration")
    parser.add_argument("--response-length", type=int, default=None, help="ppo: tokens per response")
    parser.add_argument(
        "--engine",
        default="auto",
        help="ppo: rollout.engine (auto, eager, static, cuda_graph, compiled); on CUDA auto compiles a "
        "rollout of 33+ tokens from its third iteration on (rlhf/models/decoding.py): name the engine, or "
        "--warmup 3, for steady-state figures",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="ppo: train.compile (the update's forwards compiled by inductor); its first iteration "
        "compiles (and the compiled sampler's, on CUDA): --warmup 2 or more",
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="sampler: alternated repetitions per batch")
    parser.add_argument("--new-tokens", type=int, default=64, help="sampler: tokens per response")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (host side)")
    args = parser.parse_args()
    if args.case == "info":  # torch alone: the check runs on every `make bench`
        torch.set_num_threads(args.threads)
        info = device_info()
        if info["cuda"]:
            info["matmul_gflops"] = matmul_rates("cuda")
        emit(info)
        return
    set_threads(args.threads)
    if args.case == "ppo":
        if args.workload is None:
            parser.error("ppo needs --workload")
        workload = workload_named(args.workload)
        if args.batch_size or args.response_length:  # another rollout shape, e.g. the 32 x 64
            workload = dataclasses.replace(
                workload,
                batch_size=args.batch_size or workload.batch_size,
                response_length=args.response_length or workload.response_length,
            )
        emit(
            ppo_iteration(
                workload,
                args.device,
                args.dtype,
                iters=args.iters,
                warmup=args.warmup,
                model_dir=args.model,
                engine=args.engine,
                compile=args.compile,
            )
        )
    else:
        if args.model is None:
            parser.error("sampler needs --model DIR (the SmolLM2 float32 directory)")
        if args.dtype not in DTYPES:
            parser.error(f"sampler: --dtype must be one of {', '.join(DTYPES)} (the weights' dtype)")
        from bench.speed import smollm2

        tokenizer, model = smollm2.load(args.model)
        prompts = smollm2.chat_prompts(tokenizer, 16)
        emit(
            sampler_vs_generate(
                model, tokenizer, prompts, args.device, args.dtype, reps=args.reps, new_tokens=args.new_tokens
            )
        )


if __name__ == "__main__":
    main()
