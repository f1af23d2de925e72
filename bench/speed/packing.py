"""SFT tokens/s with and without sequence packing (`train.packing`, rlhf/models/packing.py) on a
real model and the HH data.

    .venv/bin/python -m bench.speed.packing --model DIR [--gguf_file F] --data FILE
        [--rows 16] [--micro 8] [--max_tokens 256] [--steps 2] [--rounds 2] [--threads N] [--out JSON]
        [--device cuda --dtype bfloat16]

The same optimizer steps (`rlhf.stages.sft.sft_step`: the rows of a step sorted by length, micro-
batches of `--micro` rows; with packing cut by `packed_groups` under micro x the longest row) run
A/B interleaved: each round runs every step padded, then packed, on copies of the same starting
model, so a load that changes during the run weighs on both. Reported: real (non-padding) tokens
per second of each, the computed tokens (rows x width of every forward), their ratio, and the
NLL sums (equal to float rounding: packing changes no loss). CPU float32 by default; `--device cuda
--dtype bfloat16` times the GPU path (the training's autocast, the device idle at both ends).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time

import torch

from bench.common import synchronize
from rlhf.config import OptimConfig
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats, encode_sft
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.packing import enable_packing, first_fit
from rlhf.models.precision import Precision
from rlhf.stages.sft import EncodedSFT, sft_positions, sft_step
from rlhf.train.learner import Learner, Training
from rlhf.train.micro_batches import MicroBatching, split_rows
from rlhf.train.supervised.model_call import ModelCall


def computed_tokens(rows: list[EncodedSFT], micro: int, packing: bool) -> int:
    """Tokens the decoder computes in one step (the last column is never computed)."""
    lengths = [sft_positions(r) for r in rows]
    total = 0
    for group in split_rows(lengths, micro, True, None, packing):
        seqs = [lengths[i] - (1 if lengths[i] == max(lengths[j] for j in group) else 0) for i in group]
        width = max(seqs)
        total += (len(first_fit(seqs, width)) if packing else len(group)) * width
    return total


def run(
    model, steps: list[list[EncodedSFT]], pad_id: int, micro: int, packing: bool, precision: Precision
) -> tuple[float, float]:
    """(seconds, summed NLL) of `steps` optimizer steps on a copy of `model` under `precision`."""
    model = copy.deepcopy(model)
    if packing:
        enable_packing(model)
    learner = Learner.build(
        ModelCall(model),
        Training(OptimConfig(lr=1e-6), len(steps), MicroBatching(micro, True, None, packing)),
    )
    nll = 0.0
    synchronize(precision.device)
    start = time.perf_counter()
    for rows in steps:
        loss, _, _ = sft_step(learner, rows, pad_id, precision)
        nll += loss
    synchronize(precision.device)
    return time.perf_counter() - start, nll


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a causal LM directory (or one holding --gguf_file)")
    parser.add_argument("--gguf_file", default=None)
    parser.add_argument("--data", required=True, help="HH pairs (chosen responses as SFT rows)")
    parser.add_argument("--rows", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (train.micro_batch_size)")
    parser.add_argument("--max_tokens", type=int, default=256, help="prompt and response budgets")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (padded then packed)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast policy")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("rlhf.data.loading").setLevel(logging.ERROR)
    tokenizer = load_tokenizer(args.model, gguf_file=args.gguf_file)
    precision = Precision.resolve(args.dtype, torch.device(args.device))
    model = load_causal_lm(args.model, gguf_file=args.gguf_file, dtype=torch.float32).to(args.device).train()
    stats = TruncationStats()
    examples = load_examples(args.data, kind="sft", skip_invalid=True).examples
    need = args.rows * args.steps
    rows = [
        EncodedSFT(*encode_sft(tokenizer, ex, args.max_tokens, args.max_tokens, stats))
        for ex in examples[:need]
    ]
    steps = [rows[k : k + args.rows] for k in range(0, need, args.rows)]
    real = sum(sft_positions(r) - 1 for r in rows)
    computed = {p: sum(computed_tokens(s, args.micro, p) for s in steps) for p in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    nll: dict[bool, float] = {}
    for _ in range(args.rounds):
        for packing in (False, True):
            seconds, nll[packing] = run(model, steps, tokenizer.pad_token_id, args.micro, packing, precision)
            times[packing].append(seconds)
            print(
                f"{'packed' if packing else 'padded'}: {seconds:.1f} s, {real / seconds:.0f} tokens/s",
                flush=True,
            )
    best = {p: min(t) for p, t in times.items()}
    result = {
        "model": os.path.basename(os.path.normpath(args.model))
        + (f"/{args.gguf_file}" if args.gguf_file else ""),
        "rows_per_step": args.rows,
        "micro_batch_size": args.micro,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if precision.device.type == "cuda" else "cpu",
        "dtype": args.dtype,
        "real_tokens": real,
        "computed_tokens": {"padded": computed[False], "packed": computed[True]},
        "padded_share": {
            "padded": round(1 - real / computed[False], 3),
            "packed": round(1 - real / computed[True], 3),
        },
        "seconds": {"padded": times[False], "packed": times[True]},
        "tokens_per_s_best": {"padded": round(real / best[False], 1), "packed": round(real / best[True], 1)},
        "speedup_best": round(best[False] / best[True], 3),
        "nll_sum": {"padded": nll[False], "packed": nll[True]},
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
