"""Supervised fine-tuning: next-token loss on response tokens only (`rlhf sft`).

The model, its batches and its optimizer live on `train.device`; forwards run under the `dtype`
policy (rlhf.models.precision) and the loss is reduced in float32; the saved model is float32.
The data order comes from a CPU generator, so it is the same on every device.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from rlhf.config import SFTConfig
from rlhf.data.collate import collate_sft
from rlhf.data.length_grouping import length_grouped_order, micro_batch_groups
from rlhf.data.loading import load_examples, split_examples
from rlhf.data.tokenize import TruncationStats, encode_sft
from rlhf.models.device import model_device, resolve_device, to_device
from rlhf.models.grad_checkpointing import gradient_checkpointing
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision, cast_parameters
from rlhf.monitor import print_summary
from rlhf.rundir.directory import open_metrics_logger
from rlhf.rundir.export import export_models
from rlhf.rundir.final_report import write_final_report
from rlhf.runtime import fsdp
from rlhf.runtime.fsdp import gathered, shard_trained, whole_copies
from rlhf.runtime.peers import Peers, current_peers
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.optim import build_optimizer, clip_and_step
from rlhf.train.setup import start_run, with_lora


@dataclass
class EncodedSFT:
    prompt_ids: list[int]
    response_ids: list[int]  # EOS (or the chat template's end-of-turn token) included


def encode_sft_examples(tokenizer, examples, config: SFTConfig, stats: TruncationStats) -> list[EncodedSFT]:
    d = config.data
    return [
        EncodedSFT(
            *encode_sft(tokenizer, ex, d.max_prompt_tokens, d.max_response_tokens, stats, d.chat_template)
        )
        for ex in examples
    ]


def sft_batch(rows: list[EncodedSFT], pad_id: int) -> dict:
    return collate_sft([r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id)


def _batch_nll(model, rows: list[EncodedSFT], pad_id: int, precision: Precision | None):
    """Summed NLL (float32) and token count of `rows`, on the model's device under `precision`."""
    batch = to_device(sft_batch(rows, pad_id), model_device(model))
    with precision.autocast() if precision is not None else contextlib.nullcontext():
        return model_token_nll(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])


def micro_batches(rows: list[EncodedSFT], size: int, by_length: bool) -> list[list[EncodedSFT]]:
    """`rows` cut into micro-batches of `size`; `by_length`: longest first, so each pads little."""
    groups = micro_batch_groups([len(r.prompt_ids) + len(r.response_ids) for r in rows], size, by_length)
    return [[rows[i] for i in group] for group in groups]


def train_steps(
    model,
    rows: list[EncodedSFT],
    pad_id: int,
    micro_batch_size: int,
    precision: Precision | None = None,
    by_length: bool = False,
    peers: Peers | None = None,
) -> tuple[float, int]:
    """Forward/backward one optimizer batch with token-weighted gradient accumulation: the loss is
    the NLL summed over the batch's response tokens / their count, whatever the micro-batches
    (`by_length`: rows sorted by length before the split, rlhf.data.length_grouping); with `peers`
    (data parallelism) on this rank's share of the rows, the mean over every rank's tokens."""
    total = sum(len(r.response_ids) for r in rows)  # every response token is scored (prompts are never empty)
    mine = rows if peers is None else rows[peers.rows(len(rows))]
    loss_sum = 0.0
    for micro in micro_batches(mine, micro_batch_size, by_length):
        nll, count = _batch_nll(model, micro, pad_id, precision)
        (nll / total).backward()  # token mean over the whole batch, however it is split
        loss_sum += float(nll.detach())
    return (loss_sum if peers is None else peers.sum(loss_sum)), total


@torch.no_grad()
def evaluate_nll(
    model,
    rows: list[EncodedSFT],
    pad_id: int,
    batch_size: int,
    precision: Precision | None = None,
    by_length: bool = False,
    peers: Peers | None = None,
) -> dict:
    """Token-mean NLL and perplexity on response tokens (EOS included); `by_length`: rows sorted by
    length before batching (a sum over tokens: the same figures, less padding); with `peers` each
    rank evaluates its share of the rows."""
    was_training = model.training
    model.eval()
    mine = rows if peers is None else rows[peers.rows(len(rows))]
    nll_sum, count = 0.0, 0
    for micro in micro_batches(mine, batch_size, by_length):
        nll, n = _batch_nll(model, micro, pad_id, precision)
        nll_sum, count = nll_sum + float(nll), count + n
    if peers is not None:
        nll_sum, count = peers.sums([nll_sum, count])
        count = int(count)
    model.train(was_training)
    loss = nll_sum / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


def run_sft(
    config: SFTConfig,
    *,
    model=None,
    tokenizer=None,
    train_rows: list[EncodedSFT] | None = None,
    test_rows: list[EncodedSFT] | None = None,
    quiet: bool = False,
) -> dict:
    """Train, evaluate, and save a Hugging Face directory at `config.out`. Returns the final metrics.

    With held-out rows, the first record of metrics.jsonl is the baseline: `{"step": 0, "eval/loss",
    "eval/ppl", "eval/tokens"}` of the model before any update (no train/ keys; the training records
    that follow count steps from 0 as well, step 0 being the first update). Evaluation draws no
    random numbers, so the baseline leaves the training itself unchanged.

    `train_rows` / `test_rows` replace the rows read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    """
    device = resolve_device(config.train.device, key="train.device")
    precision = Precision.resolve(config.dtype, device, key="dtype")
    peers = current_peers()  # torchrun: this rank's share of every batch (rlhf/runtime/peers.py)
    writer = peers is None or peers.rank == 0
    out, tokenizer = start_run(config, tokenizer, writer=writer)
    if model is None:
        model = load_causal_lm(config.model, gguf_file=config.gguf_file)
    model = precision.prepare(with_lora(model, config.lora))
    if peers is not None:
        peers.broadcast_parameters(model.parameters())  # one start for every rank
    if config.gradient_checkpointing:
        gradient_checkpointing(model)
    stats = TruncationStats()
    if train_rows is None:
        loaded = load_examples(
            config.data.path, kind="sft", format=config.data.format, skip_invalid=config.data.skip_invalid
        )
        train_ex, test_ex = split_examples(loaded.examples, config.data.test_fraction, seed=config.seed)
        train_rows = encode_sft_examples(tokenizer, train_ex, config, stats)
        if test_rows is None:
            test_rows = encode_sft_examples(tokenizer, test_ex, config, stats)
    test_rows = test_rows or []
    if not train_rows:
        raise ValueError("no training SFT examples: the data left nothing to train on. Fix: check data.path.")
    pad_id = tokenizer.pad_token_id
    t = config.train
    steps = t.max_steps or max(1, math.ceil(t.epochs * len(train_rows) / t.batch_size))
    optimizer, scheduler = build_optimizer(model.parameters(), config.optim, steps)
    sharded = shard_trained(config.dist.strategy, model, optimizer, peers)  # fsdp2: [model]
    generator = torch.Generator().manual_seed(config.seed)  # data order: on the CPU, the same everywhere
    order: list[int] = []
    by_length = t.group_by_length != "none"  # micro-batches of similar-length rows (length_grouping.py)
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in train_rows]
    logger = open_metrics_logger(
        out,
        resumable=False,
        sinks=tuple(config.sinks),  # `quiet` only drops the final summary table
        total=steps,
        key_metrics=("train/loss", "eval/loss", "eval/ppl"),
        writer=writer,
    )
    final: dict = {}
    baseline: dict = {}
    with logger:
        if test_rows:  # the baseline: held-out loss and perplexity of the model before any update
            with gathered(sharded):
                before = evaluate_nll(
                    model, test_rows, pad_id, t.micro_batch_size, precision, by_length, peers
                )
            logger.log(0, {f"eval/{k}": v for k, v in before.items()}, kind="step")
            baseline = {
                "eval/loss_before_training": before["loss"],
                "eval/ppl_before_training": before["ppl"],
            }
        model.train()
        for step in range(steps):
            while len(order) < t.batch_size:  # a fresh shuffled epoch whenever the current one runs out
                order += torch.randperm(len(train_rows), generator=generator).tolist()
                if t.group_by_length == "across_steps":  # steps of similar-length rows (HF group_by_length);
                    # the last epoch's leftover rows join in, so that steps stay aligned with the groups
                    order = length_grouped_order(order, lengths, t.batch_size, generator)
            rows = [train_rows[i] for i in order[: t.batch_size]]
            del order[: t.batch_size]
            with gathered(sharded):  # fsdp2: the whole model for the step's micro-batches
                loss_sum, tokens = train_steps(
                    model, rows, pad_id, t.micro_batch_size, precision, by_length, peers
                )
                if sharded:  # summed, cut to this rank's shard, clipped by the global norm
                    grad_norm = fsdp.step(sharded[0], optimizer, scheduler, peers, config.optim.max_grad_norm)
            if not sharded:
                if peers is not None:
                    peers.sum_gradients(list(model.parameters()))  # then clip by the global norm
                grad_norm = clip_and_step(
                    optimizer, scheduler, model.parameters(), config.optim.max_grad_norm
                )
            metrics = {
                "train/loss": loss_sum / max(tokens, 1),
                "train/grad_norm": grad_norm,
                "train/lr": scheduler.get_last_lr()[0],
                "train/tokens": tokens,
            }
            last = step == steps - 1
            if test_rows and (last or (t.eval_every and (step + 1) % t.eval_every == 0)):
                with gathered(sharded):
                    held_out = evaluate_nll(
                        model, test_rows, pad_id, t.micro_batch_size, precision, by_length, peers
                    )
                metrics.update({f"eval/{k}": v for k, v in held_out.items()})
            if last or step % t.log_every == 0 or "eval/loss" in metrics:
                logger.log(step, metrics, kind="step")
            final = metrics
        final.update(baseline)
        final.update({f"data/{k}": v for k, v in stats.as_dict().items()})
    model.eval()
    cast_parameters(model, torch.float32)  # training is over: float32 in place, no copy to export
    with whole_copies(sharded):  # fsdp2: every rank gathers the weights, rank 0 exports
        if writer:
            export_models(out, tokenizer, {"": model})  # LoRA merged (a copy), whatever the training used
    if not writer:
        return final  # rank 0 exports, reports and prints
    report = write_final_report(out)
    if not quiet:
        shown = {k: v for k, v in final.items() if not isinstance(v, list)}
        print_summary(f"SFT finished: {out}", shown)
        print(f"report: {report}")  # a line of its own: the table would cut a long path
    return final
