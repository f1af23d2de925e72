"""Seconds of one SFT or RM epoch on HH rows with SmolLM2-135M, per `train.group_by_length`.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.padding_timing --stage sft --rows 128 --grouping none

One process per measurement (the caller alternates groupings); the last stdout line is JSON:
wall and CPU seconds of the forward/backward passes (model load, tokenization, optimizer steps and
the final save excluded: the timer wraps `sft_step` / `pair_step`, the optimizer step included), the tokens computed (rows x longest row per micro-batch)
and the real tokens, and the final training loss. Rows are the first `--rows` valid HH pairs,
prompts and responses cut at `--max-tokens` tokens each.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

import torch

from bench.common import emit, set_threads
from rlhf.config import RewardConfig, SFTConfig, load_config
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats

# the HH pairs and SmolLM2 (float32): these environment variables (no machine paths here)
DATA_ENV, MODEL_ENV = "RLHF_BENCH_PAIRS", "RLHF_BENCH_MODEL"


class Timer:
    """Wraps a step function: total seconds inside it, and the tokens it computed."""

    def __init__(self, fn, cost) -> None:
        self.fn, self.cost, self.seconds, self.cpu_seconds, self.computed = fn, cost, 0.0, 0.0, 0

    def __call__(self, *args, **kwargs):
        started, cpu = time.perf_counter(), time.process_time()
        out = self.fn(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        self.cpu_seconds += time.process_time() - cpu
        self.computed += self.cost(*args, **kwargs)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stage", choices=("sft", "rm"), required=True)
    parser.add_argument("--grouping", choices=("none", "within_step", "across_steps"), required=True)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    data, model = os.environ.get(DATA_ENV), os.environ.get(MODEL_ENV)
    if not data or not model:
        parser.error(f"set ${DATA_ENV} (HH pairs, harmless-base test) and ${MODEL_ENV} (SmolLM2's directory)")
    set_threads(args.threads)
    logging.getLogger("rlhf.data.loading").setLevel(logging.ERROR)
    from rlhf.data.length_grouping import padded_tokens
    from rlhf.models.loading import load_tokenizer
    from rlhf.stages import rm as reward_model
    from rlhf.stages import sft

    tokenizer = load_tokenizer(model)
    kind = "sft" if args.stage == "sft" else "preference"
    examples = load_examples(data, kind=kind, skip_invalid=True).examples[: args.rows]
    out = tempfile.mkdtemp(prefix="padding_timing_")
    overrides = {
        "model": model,
        "out": f"{out}/run",
        "data": {"max_prompt_tokens": args.max_tokens, "max_response_tokens": args.max_tokens},
        "train": {
            "epochs": 1,
            "batch_size": args.batch_size,
            "micro_batch_size": args.micro_batch_size,
            "eval_every": 0,
            "log_every": 1000,
            "group_by_length": args.grouping,
            "device": "cpu",
        },
        "sinks": ["jsonl"],
    }
    stats = TruncationStats()
    if args.stage == "sft":
        config = load_config(SFTConfig, overrides=overrides)
        rows = sft.encode_sft_examples(tokenizer, examples, config, stats)
        real = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)

        def cost(learner, step_rows, pad_id, precision=None):
            lengths = [len(r.prompt_ids) + len(r.response_ids) for r in step_rows]
            return padded_tokens(lengths, learner.split(lengths))

        timer = sft.sft_step = Timer(sft.sft_step, cost)
        final = sft.run_sft(config, tokenizer=tokenizer, train_rows=rows, test_rows=[], quiet=True)
    else:
        config = load_config(
            RewardConfig, overrides={**overrides, "train": {**overrides["train"], "lm_coef": 1.0}}
        )
        rows = reward_model.encode_pairs(tokenizer, examples, config, stats)
        real = sum(2 * len(r.prompt_ids) + len(r.chosen_ids) + len(r.rejected_ids) for r in rows)

        def cost(learner, step_rows, pad_id, lm_coef, precision=None):
            lengths = [len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)) for r in step_rows]
            return 2 * padded_tokens(lengths, learner.split(lengths))

        timer = reward_model.pair_step = Timer(reward_model.pair_step, cost)
        final = reward_model.run_reward_training(
            config, tokenizer=tokenizer, train_rows=rows, test_rows=[], quiet=True
        )
    shutil.rmtree(out, ignore_errors=True)  # the saved model (~0.5 GB): not needed
    emit(
        {
            "stage": args.stage,
            "grouping": args.grouping,
            "rows": len(rows),
            "seconds": round(timer.seconds, 1),
            "cpu_seconds": round(timer.cpu_seconds, 1),  # this process's CPU time: less hit by other jobs
            "computed_tokens": timer.computed,
            "real_tokens": real,
            "padded_fraction": round(1 - real / timer.computed, 3),
            "final_train_loss": final.get("train/loss"),
            "threads": torch.get_num_threads(),
        }
    )


if __name__ == "__main__":
    main()
