"""Padded-token fraction of SFT, RM and PPO micro-batches on real HH-RLHF pairs.

    .venv/bin/python -m bench.speed.padding [--data FILE] [--tokenizer DIR [--gguf_file F]] [--budgets 1024,2048,4096] [--json]

Tokenizes the pairs as `rlhf sft` / `rlhf rm` do by default (SmolLM2's chat template, prompts <= 256
tokens, responses <= 256), batches them as the trainers do with their default sizes, and prints,
per stage, the share of computed tokens that are padding: 1 - real tokens / (rows x longest row),
summed over micro-batches. No model runs: this is bookkeeping over token lengths only.

Stages and groupings (`train.group_by_length`, `runtime.sort_by_length`):
- SFT: steps of 16 rows, micro-batches of 8; the held-out evaluation in micro-batches of 8.
- RM: steps of 16 pairs, micro-batches of 8 pairs = 16 rows padded to the longest of chosen and
  rejected.
- PPO (a proxy: no sampling here): rollout batches of 64 prompts, micro-batches of 16, the rollout
  layout (left-padded prompt block + right-padded response block, trimmed per micro-batch, so a
  micro-batch costs rows x (longest prompt + longest response)); the response lengths are the HH
  chosen responses' lengths cut at 64 tokens (`rollout.max_new_tokens`).
- Token budgets (`train.micro_batch_tokens`, `--budgets`): the same steps (within_step order) cut
  by a budget of rows x longest row instead of 8 rows (PPO: 16 rows of a 64-row minibatch), per
  budget the padded fraction, the forward/backward passes per step and the largest pass's padded
  tokens (what bounds the activations' memory), beside the row-count path's.
- Sequence packing (`train.packing`): the same steps cut by `split_rows(..., packing=True)` (under
  each budget, and under "rows": 8 rows x the longest row, what a padded micro-batch computes at
  most), each pass's sequences packed first-fit into rows as wide as its longest
  (rlhf/models/packing.py): the padded fraction left, passes per step and the largest pass.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import torch

from rlhf.data.chat import response_end_id
from rlhf.data.length_grouping import (
    length_grouped_order,
    micro_batch_groups,
    padded_tokens,
    token_budget_groups,
)
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats, encode_prompt, encode_response, encode_sft
from rlhf.models.loading import load_tokenizer
from rlhf.models.packing import first_fit
from rlhf.train.micro_batches import split_rows

# the HH pairs and the tokenizer: flags, else these environment variables (no machine paths here)
DATA_ENV, TOKENIZER_ENV = "RLHF_BENCH_PAIRS", "RLHF_BENCH_MODEL"


def fraction(real: int, computed: int) -> float:
    return 1.0 - real / max(computed, 1)


def steps_of(order: list[int], batch_size: int) -> list[list[int]]:
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


def micro_padding(lengths: list[int], steps: list[list[int]], micro: int, by_length: bool) -> int:
    """Computed tokens when every step is cut into micro-batches (sorted or not) and each is padded."""
    total = 0
    for step in steps:
        step_lengths = [lengths[i] for i in step]
        total += padded_tokens(step_lengths, micro_batch_groups(step_lengths, micro, by_length))
    return total


def grouped_fractions(lengths: list[int], real: int, rows_per_item: int, batch: int, micro: int) -> dict:
    """Padded fraction of one epoch in steps of `batch`, micro-batches of `micro`, per grouping."""
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    grouped = length_grouped_order(order, lengths, batch, generator)
    computed = {
        "none": micro_padding(lengths, steps_of(order, batch), micro, by_length=False),
        "within_step": micro_padding(lengths, steps_of(order, batch), micro, by_length=True),
        "across_steps": micro_padding(lengths, steps_of(grouped, batch), micro, by_length=True),
    }
    return {k: round(fraction(real, rows_per_item * v), 3) for k, v in computed.items()}


def budget_table(
    lengths: list[int],
    real: int,
    rows_per_item: int,
    steps: list[list[int]],
    micro: int,
    budgets: list[int],
    cost=None,
) -> dict:
    """Per split (`rows`: micro-batches of `micro`, sorted; each budget): the padded fraction, the
    passes per step and the largest pass's padded tokens, over `steps`. `cost(group)`: a
    micro-batch's padded tokens (default rows x longest of `lengths`, times `rows_per_item`)."""
    cost = cost or (lambda group: rows_per_item * len(group) * max(lengths[i] for i in group))
    splits = {"rows": lambda ls: micro_batch_groups(ls, micro, True)}
    splits.update({str(b): (lambda ls, b=b: token_budget_groups(ls, b)) for b in budgets})
    out = {}
    for name, split in splits.items():
        computed, passes, largest = 0, 0, 0
        for step in steps:
            for group in split([rows_per_item * lengths[i] for i in step]):
                c = cost([step[k] for k in group])
                computed, passes, largest = computed + c, passes + 1, max(largest, c)
        out[name] = {
            "padded": round(fraction(real, computed), 3),
            "passes_per_step": round(passes / len(steps), 2),
            "largest_pass": largest,
        }
    return out


def packed_table(
    measures: list[int], rows_of, real: int, steps: list[list[int]], micro: int, budgets: list[int]
) -> dict:
    """`budget_table` with sequence packing: each step cut as `Learner.split` cuts it with
    `train.packing` (the items' `measures`, as the stage measures them), each pass costing its packed
    rows x its longest sequence; `rows_of(i)`: the real lengths of item i's sequences (a pair: 2)."""
    out = {}
    for name, budget in [("rows", None)] + [(str(b), b) for b in budgets]:
        computed, passes, largest = 0, 0, 0
        for step in steps:
            for group in split_rows([measures[i] for i in step], micro, True, budget, packing=True):
                rows = [n for k in group for n in rows_of(step[k])]
                width = max(rows)
                c = len(first_fit(rows, width)) * width
                computed, passes, largest = computed + c, passes + 1, max(largest, c)
        out[name] = {
            "padded": round(fraction(real, computed), 3),
            "passes_per_step": round(passes / len(steps), 2),
            "largest_pass": largest,
        }
    return out


def rollout_cost(prompts: list[int], responses: list[int], rows: list[int], micro: int, key) -> int:
    """Computed tokens of one rollout batch's forwards: micro-batches of the rows in `key` order
    (None: as drawn), each costing rows x (longest prompt + longest response)."""
    order = sorted(rows, key=key) if key else list(rows)
    cost = 0
    for k in range(0, len(order), micro):
        group = order[k : k + micro]
        cost += len(group) * (max(prompts[i] for i in group) + max(responses[i] for i in group))
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", default=os.environ.get(DATA_ENV), help=f"HH pairs (harmless-base test), or ${DATA_ENV}"
    )
    parser.add_argument(
        "--tokenizer", default=os.environ.get(TOKENIZER_ENV), help=f"SmolLM2's directory, or ${TOKENIZER_ENV}"
    )
    parser.add_argument("--gguf_file", default=None, help="a GGUF file inside --tokenizer (its tokenizer)")
    parser.add_argument(
        "--budgets",
        default="1024,2048,4096",
        help="train.micro_batch_tokens values to compare (comma-separated)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",") if b]
    if not args.data or not args.tokenizer:
        parser.error(f"needs --data (or ${DATA_ENV}) and --tokenizer (or ${TOKENIZER_ENV})")
    logging.getLogger("rlhf.data.loading").setLevel(logging.ERROR)  # the 5 malformed HH lines: skipped
    tokenizer = load_tokenizer(args.tokenizer, gguf_file=args.gguf_file)
    stats = TruncationStats()

    sft = [
        encode_sft(tokenizer, ex, 256, 256, stats)
        for ex in load_examples(args.data, kind="sft", skip_invalid=True).examples
    ]
    sft_lengths = [len(p) + len(r) for p, r in sft]
    results = {"rows": len(sft)}
    results["sft_train"] = grouped_fractions(sft_lengths, sum(sft_lengths), 1, batch=16, micro=8)
    evaluation = {}
    for name, by_length in (("none", False), ("within_step", True)):
        groups = micro_batch_groups(sft_lengths, 8, by_length)
        evaluation[name] = round(fraction(sum(sft_lengths), padded_tokens(sft_lengths, groups)), 3)
    results["sft_eval"] = evaluation
    order = torch.randperm(len(sft_lengths), generator=torch.Generator().manual_seed(0)).tolist()
    results["sft_train_budget"] = budget_table(
        sft_lengths, sum(sft_lengths), 1, steps_of(order, 16), 8, budgets
    )
    results["sft_train_packed"] = packed_table(
        sft_lengths, lambda i: [sft_lengths[i]], sum(sft_lengths), steps_of(order, 16), 8, budgets
    )

    pairs = load_examples(args.data, kind="preference", skip_invalid=True).examples
    encoded = []
    for ex in pairs:
        prompt = encode_prompt(tokenizer, ex.prompt, 256, stats)
        end = response_end_id(tokenizer, ex.prompt, "auto")  # as `rlhf rm` encodes pairs
        encoded.append(
            (
                prompt,
                encode_response(tokenizer, ex.chosen, 256, stats, end),
                encode_response(tokenizer, ex.rejected, 256, stats, end),
            )
        )
    pair_lengths = [len(p) + max(len(c), len(r)) for p, c, r in encoded]  # a pair pads to its longer side
    pair_real = sum(2 * len(p) + len(c) + len(r) for p, c, r in encoded)
    results["rm_train"] = grouped_fractions(pair_lengths, pair_real, 2, batch=16, micro=8)
    order = torch.randperm(len(pair_lengths), generator=torch.Generator().manual_seed(0)).tolist()
    results["rm_train_budget"] = budget_table(pair_lengths, pair_real, 2, steps_of(order, 16), 8, budgets)
    pair_rows = [(len(p) + len(c), len(p) + len(r)) for p, c, r in encoded]
    results["rm_train_packed"] = packed_table(
        [2 * n for n in pair_lengths], lambda i: pair_rows[i], pair_real, steps_of(order, 16), 8, budgets
    )  # measured as `rlhf rm` measures a pair (rlhf/stages/rm.py pair_positions)

    prompts = [len(p) for p, _, _ in encoded]
    responses = [min(len(c), 64) for _, c, _ in encoded]
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(prompts), generator=generator).tolist()
    real = sum(prompts) + sum(responses)
    ppo = {"unsorted": 0, "sort_by_length": 0, "by_prompt_length": 0}
    for rollout in steps_of(order, 64):
        ppo["unsorted"] += rollout_cost(prompts, responses, rollout, 16, None)
        ppo["sort_by_length"] += rollout_cost(
            prompts, responses, rollout, 16, lambda i: -(prompts[i] + responses[i])
        )
        ppo["by_prompt_length"] += rollout_cost(prompts, responses, rollout, 16, lambda i: -prompts[i])
    results["ppo_forwards_proxy"] = {k: round(fraction(real, v), 3) for k, v in ppo.items()}
    # the update's micro-batches: minibatches of 64 rows cut by real length (prompt + response), each
    # costing rows x (longest prompt + longest response) in the rollout layout
    lengths = [p + r for p, r in zip(prompts, responses)]
    results["ppo_update_budget"] = budget_table(
        lengths, real, 1, steps_of(order, 64), 16, budgets,
        cost=lambda g: len(g) * (max(prompts[i] for i in g) + max(responses[i] for i in g)),
    )  # fmt: skip
    results["ppo_update_packed"] = packed_table(
        lengths, lambda i: [lengths[i]], real, steps_of(order, 64), 16, budgets
    )
    results["mean_tokens"] = {
        "sft_row": round(sum(sft_lengths) / len(sft_lengths), 1),
        "rm_pair_rows": round(pair_real / (2 * len(encoded)), 1),
        "ppo_prompt": round(sum(prompts) / len(prompts), 1),
    }
    if args.json:
        print(json.dumps(results))
        return
    print(f"{len(sft)} HH rows, tokenizer {args.tokenizer}; padded-token fraction per stage")
    for stage in ("sft_train", "sft_eval", "rm_train", "ppo_forwards_proxy"):
        print(f"  {stage:20s} " + "  ".join(f"{k} {v:.3f}" for k, v in results[stage].items()))
    print(f"  mean tokens: {results['mean_tokens']}")
    print("token budgets (train.micro_batch_tokens) against rows: padded fraction, passes/step, largest pass")
    stages = ("sft_train_budget", "rm_train_budget", "ppo_update_budget")
    packed = ("sft_train_packed", "rm_train_packed", "ppo_update_packed")
    for stage in stages + packed:
        if stage == packed[0]:
            print("sequence packing (train.packing), rows = micro_batch_size x longest row as the budget")
        cells = [
            f"{k} {v['padded']:.3f} {v['passes_per_step']:.2f} {v['largest_pass']}"
            for k, v in results[stage].items()
        ]
        print(f"  {stage:20s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
