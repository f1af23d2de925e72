"""Supervised fine-tuning: next-token loss on response tokens only (`rlhf sft`).

The model, its batches and its optimizer live on `train.device`; forwards run under the `dtype`
policy (rlhf.models.precision) and the loss is reduced in float32; the saved model is float32.
The data order comes from a CPU generator, so it is the same on every device.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhf.config import SFTConfig
from rlhf.data.collate import collate_sft
from rlhf.data.tokenize import TruncationStats, encode_sft
from rlhf.models.device import model_device, to_device
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision
from rlhf.train.learner import Learner
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.micro_batches import MicroBatch, RowList
from rlhf.train.optimizer import step_metrics
from rlhf.train.setup import with_lora
from rlhf.train.supervised import StageInputs, SupervisedRun, SupervisedStage, placed, run_supervised
from rlhf.train.supervised.model_call import call_model

if TYPE_CHECKING:
    from typing_extensions import Unpack


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


def sft_step(
    learner: Learner, rows: list[EncodedSFT], pad_id: int, precision: Precision | None = None
) -> tuple[float, int, float]:
    """One optimizer step of the next-token loss on `rows` (rlhf/train/learner.py `Learner.step`):
    the NLL summed over the batch's response tokens / their count, whatever the micro-batches and
    ranks; (the NLL sum, the token count, the pre-clip gradient norm)."""
    total = sum(len(r.response_ids) for r in rows)  # every response token is scored (prompts are never empty)

    def loss(micro: MicroBatch):
        nll, _ = _batch_nll(learner.call, micro.rows, pad_id, precision)
        return nll / total, {"nll": nll.detach()}  # the token mean over the whole batch

    sums, grad_norm = learner.step(RowList(rows, sft_positions), loss, sums=("nll",))
    return sums["nll"], total, grad_norm


def evaluate_nll(
    learner: Learner, rows: list[EncodedSFT], pad_id: int, precision: Precision | None = None
) -> dict:
    """Token-mean NLL and perplexity on response tokens (EOS included), each rank on its share of
    the rows (`Learner.forward_passes`; by length: the same figures, less padding)."""
    model = learner.call
    was_training = model.training
    model.eval()

    def nll(micro: MicroBatch) -> dict:
        value, count = _batch_nll(model, micro.rows, pad_id, precision)
        return {"nll": value, "tokens": count}

    sums = learner.forward_passes(RowList(rows, sft_positions), nll, sums=("nll", "tokens"))
    model.train(was_training)
    loss, count = sums["nll"] / max(sums["tokens"], 1), int(sums["tokens"])
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


def sft_positions(row: EncodedSFT) -> int:
    """The positions one forward of `row` computes."""
    return len(row.prompt_ids) + len(row.response_ids)


class SFTStage(SupervisedStage):
    """Next-token loss on response tokens, evaluated by held-out loss and perplexity."""

    title = "SFT"
    command = "sft"
    data_kind = "sft"
    empty_data = "training SFT examples"
    key_metrics = ("train/loss", "eval/loss", "eval/ppl")
    baseline_eval = True  # the first record: held-out loss and perplexity before any update
    uses_every_parameter = True  # the decoder and the output head in every pass

    def __init__(self, config: SFTConfig) -> None:
        super().__init__(config)
        self.baseline: dict | None = None  # the held-out figures before the first update

    def build_model(self, model, precision: Precision, on_meta: bool = False):
        if model is None:
            model = load_causal_lm(self.config.model, gguf_file=self.config.gguf_file, on_meta=on_meta)
        return placed(precision, with_lora(model, self.config.lora))

    def encode(self, tokenizer, examples, stats: TruncationStats) -> list[EncodedSFT]:
        return encode_sft_examples(tokenizer, examples, self.config, stats)

    def positions(self, row: EncodedSFT) -> int:
        return sft_positions(row)

    def train_step(self, run: SupervisedRun, rows: list[EncodedSFT]) -> dict:
        loss_sum, tokens, grad_norm = sft_step(run.learner, rows, run.pad_id, run.precision)
        return {
            "train/loss": loss_sum / max(tokens, 1),
            "train/tokens": tokens,
            **step_metrics("train", grad_norm),
        }

    def evaluate(self, run: SupervisedRun, rows: list[EncodedSFT], step: int | None = None) -> dict:
        result = evaluate_nll(run.learner, rows, run.pad_id, run.precision)
        if step is None:  # before the first update
            self.baseline = result
        return result

    def finish(self, run: SupervisedRun, final: dict, stats: TruncationStats) -> dict:
        if self.baseline is not None:
            final["eval/loss_before_training"] = self.baseline["loss"]
            final["eval/ppl_before_training"] = self.baseline["ppl"]
        return super().finish(run, final, stats)


def run_sft(config: SFTConfig, **inputs: Unpack[StageInputs]) -> dict:
    """Train, evaluate, and save a Hugging Face directory at `config.out`. Returns the final metrics
    (rlhf/train/supervised/ runs the stage).

    With held-out rows, the first record of metrics.jsonl is the baseline: `{"step": 0, "eval/loss",
    "eval/ppl", "eval/tokens"}` of the model before any update (no train/ keys; the training records
    that follow count steps from 0 as well, step 0 being the first update). Evaluation draws no
    random numbers, so the baseline leaves the training itself unchanged.

    `train_rows` / `test_rows` replace the rows read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    """
    return run_supervised(SFTStage(config), **inputs)
