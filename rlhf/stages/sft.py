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
from rlhf.data.length_grouping import micro_batch_groups
from rlhf.data.tokenize import TruncationStats, encode_sft
from rlhf.models.device import model_device, to_device
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision
from rlhf.runtime.peers import Peers
from rlhf.train.learner import Learner
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.lockstep import with_fillers
from rlhf.train.model_call import call_model
from rlhf.train.setup import with_lora
from rlhf.train.supervised import (
    SupervisedRun,
    SupervisedStage,
    placed,
    run_supervised,
    shuffled_step_batches,
    steps_of_epochs,
)


@dataclass
class EncodedSFT:
    prompt_ids: list[int]
    response_ids: list[int]  # EOS (or the chat template's end-of-turn token) included


def encode_sft_examples(tokenizer, examples, config: SFTConfig, stats: TruncationStats) -> list[EncodedSFT]:
    d = config.data
    return [
        EncodedSFT(
            *encode_sft(
                tokenizer,
                ex,
                d.max_prompt_tokens,
                d.max_response_tokens,
                stats,
                d.chat_template,
                d.system_prompt,
            )
        )
        for ex in examples
    ]


def sft_batch(rows: list[EncodedSFT], pad_id: int) -> dict:
    return collate_sft([r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id)


def _batch_nll(model, rows: list[EncodedSFT], pad_id: int, precision: Precision | None):
    """Summed NLL (float32) and token count of `rows`, on the model's device under `precision`
    (`model`: a causal LM, or its ModelCall)."""
    batch = to_device(sft_batch(rows, pad_id), model_device(model))
    with precision.autocast() if precision is not None else contextlib.nullcontext():
        return call_model(
            model, model_token_nll, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
        )


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
    learner: Learner | None = None,
) -> tuple[float, int]:
    """Forward/backward one optimizer batch with token-weighted gradient accumulation: the loss is
    the NLL summed over the batch's response tokens / their count, whatever the micro-batches
    (`by_length`: rows sorted by length before the split, rlhf.data.length_grouping); with `peers`
    (data parallelism) on this rank's share of the rows, the mean over every rank's tokens;
    `learner`: the step's passes (`Learner.step_micro_batches`: under fsdp2 and ddp zero-weight
    fillers up to the largest rank's micro-batches, lockstep.py; ddp reduces in the last)."""
    total = sum(len(r.response_ids) for r in rows)  # every response token is scored (prompts are never empty)
    mine = rows if peers is None else rows[peers.rows(len(rows))]
    loss_sum = 0.0
    groups = micro_batches(mine, micro_batch_size, by_length)
    passes = (
        learner.step_micro_batches(groups, len(rows), micro_batch_size) if learner is not None else groups
    )
    for micro in passes:
        filler = micro is None  # the batch's first row: it joins the collectives and weighs nothing
        nll, count = _batch_nll(model, rows[:1] if filler else micro, pad_id, precision)
        weight = 0.0 if filler else 1.0
        (nll * weight / total).backward()  # token mean over the whole batch, however it is split
        loss_sum += float(nll.detach()) * weight
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
    per_layer: bool = False,
) -> dict:
    """Token-mean NLL and perplexity on response tokens (EOS included); `by_length`: rows sorted by
    length before batching (a sum over tokens: the same figures, less padding); with `peers` each
    rank evaluates its share of the rows (`per_layer`: fillers up to the largest rank's batches,
    their figures dropped)."""
    was_training = model.training
    model.eval()
    mine = rows if peers is None else rows[peers.rows(len(rows))]
    nll_sum, count = 0.0, 0
    groups = micro_batches(mine, batch_size, by_length)
    for micro in with_fillers(groups, len(rows), batch_size, peers, per_layer):
        nll, n = _batch_nll(model, rows[:1] if micro is None else micro, pad_id, precision)
        if micro is not None:  # a filler's figures are dropped
            nll_sum, count = nll_sum + float(nll), count + n
    if peers is not None:
        nll_sum, count = peers.sums([nll_sum, count])
        count = int(count)
    model.train(was_training)
    loss = nll_sum / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


class SFTStage(SupervisedStage):
    """Next-token loss on response tokens, evaluated by held-out loss and perplexity."""

    title = "SFT"
    command = "sft"
    data_kind = "sft"
    empty_data = "training SFT examples"
    key_metrics = ("train/loss", "eval/loss", "eval/ppl")
    baseline_eval = True  # the first record: held-out loss and perplexity before any update
    uses_every_parameter = True  # the decoder and the output head in every pass

    def build_model(self, model, precision: Precision):
        if model is None:
            model = load_causal_lm(
                self.config.model, gguf_file=self.config.gguf_file, on_meta=self.load_on_meta
            )
        return placed(precision, with_lora(model, self.config.lora))

    def encode(self, tokenizer, examples, stats: TruncationStats) -> list[EncodedSFT]:
        return encode_sft_examples(tokenizer, examples, self.config, stats)

    def schedule(self, rows, generator):
        t = self.config.train
        steps = steps_of_epochs(t.epochs, len(rows), t.batch_size, t.max_steps)
        lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
        return steps, shuffled_step_batches(steps, t.batch_size, lengths, t.group_by_length, generator)

    def positions(self, row: EncodedSFT) -> int:
        return len(row.prompt_ids) + len(row.response_ids)

    def _by_length(self) -> bool:
        return self.config.train.group_by_length != "none"  # micro-batches of similar-length rows

    def train_step(self, run: SupervisedRun, rows: list[EncodedSFT]) -> dict:
        t = self.config.train
        loss_sum, tokens = train_steps(
            run.call, rows, run.pad_id, t.micro_batch_size, run.precision, self._by_length(), run.peers,
            run.learner,
        )  # fmt: skip
        return {"train/loss": loss_sum / max(tokens, 1), "train/tokens": tokens}

    def evaluate(self, run: SupervisedRun, rows: list[EncodedSFT]) -> dict:
        t = self.config.train
        return evaluate_nll(
            run.call, rows, run.pad_id, t.micro_batch_size, run.precision, self._by_length(), run.peers,
            run.per_layer,
        )  # fmt: skip

    def finish(self, run: SupervisedRun, final: dict, stats: TruncationStats) -> dict:
        if self.baseline is not None:
            final["eval/loss_before_training"] = self.baseline["loss"]
            final["eval/ppl_before_training"] = self.baseline["ppl"]
        return super().finish(run, final, stats)


def run_sft(
    config: SFTConfig,
    *,
    model=None,
    tokenizer=None,
    train_rows: list[EncodedSFT] | None = None,
    test_rows: list[EncodedSFT] | None = None,
    quiet: bool = False,
) -> dict:
    """Train, evaluate, and save a Hugging Face directory at `config.out`. Returns the final metrics
    (rlhf/train/supervised.py runs the stage).

    With held-out rows, the first record of metrics.jsonl is the baseline: `{"step": 0, "eval/loss",
    "eval/ppl", "eval/tokens"}` of the model before any update (no train/ keys; the training records
    that follow count steps from 0 as well, step 0 being the first update). Evaluation draws no
    random numbers, so the baseline leaves the training itself unchanged.

    `train_rows` / `test_rows` replace the rows read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    """
    return run_supervised(
        SFTStage(config),
        model=model,
        tokenizer=tokenizer,
        train_rows=train_rows,
        test_rows=test_rows,
        quiet=quiet,
    )
