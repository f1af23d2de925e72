"""Reward-model training (`rlhf rm`): pairwise ranking loss + lm_coef * LM loss on the chosen response.

    L_rank = -mean log sigmoid(r(x, y_w) - r(x, y_l))          (PPO paper §4)
    L_RM   = L_rank + lm_coef * L_LM(chosen)                    (token-mean next-token CE)

The reward is read at the last real token (the EOS). Pairs are batched by count or by token budget;
the best checkpoint by held-out accuracy is the one left in the run directory. Devices and precision
as in SFT (sft.py): the scalar head and every loss in float32, checkpoints saved in float32."""

from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlhf.config import RewardConfig
from rlhf.data.chat import response_end_id
from rlhf.data.collate import collate_pairs, token_budget_batches
from rlhf.data.length_grouping import length_grouped_order
from rlhf.data.tokenize import TruncationStats, encode_prompt, encode_response
from rlhf.models.device import model_device, to_device
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel, last_token_index
from rlhf.rundir.export import export_models
from rlhf.train.learner import Learner
from rlhf.train.lm_loss import hidden_token_nll
from rlhf.train.micro_batches import MicroBatch, RowList, forward_passes, split_rows
from rlhf.train.optimizer import step_metrics
from rlhf.train.setup import with_lora
from rlhf.train.supervised import StageInputs, SupervisedRun, SupervisedStage, placed, run_supervised
from rlhf.train.supervised.model_call import call_model

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass
class EncodedPair:
    prompt_ids: list[int]
    chosen_ids: list[int]  # EOS included
    rejected_ids: list[int]  # EOS included

    @property
    def num_tokens(self) -> int:
        return 2 * len(self.prompt_ids) + len(self.chosen_ids) + len(self.rejected_ids)

    @property
    def positions(self) -> int:
        """The positions of the pair's longer side: its chosen and rejected rows share one forward."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


def encode_pairs(tokenizer, examples, config: RewardConfig, stats: TruncationStats) -> list[EncodedPair]:
    d = config.data
    rows = []
    for ex in examples:
        end = response_end_id(tokenizer, ex.prompt, d.chat_template)  # EOS, or the template's end of turn
        rows.append(
            EncodedPair(
                encode_prompt(
                    tokenizer, ex.prompt, d.max_prompt_tokens, stats, d.chat_template, d.system_prompt
                ),
                encode_response(tokenizer, ex.chosen, d.max_response_tokens, stats, end),
                encode_response(tokenizer, ex.rejected, d.max_response_tokens, stats, end),
            )
        )
    return rows


def pair_forward(
    model: ScalarHeadModel,
    rows: list[EncodedPair],
    pad_id: int,
    with_lm: bool,
    precision: Precision | None = None,
):
    """Rewards of chosen and rejected ([b] each, float32) and the LM NLL sum (float32) and count on the
    chosen responses; the batch on the model's device, forwards under `precision` (`model`: a
    ScalarHeadModel, or its ModelCall)."""
    batch = collate_pairs(
        [r.prompt_ids for r in rows], [r.chosen_ids for r in rows], [r.rejected_ids for r in rows], pad_id
    )
    batch = to_device(batch, model_device(model))
    with precision.autocast() if precision is not None else contextlib.nullcontext():
        rewards, nll, count = call_model(model, _pair_outputs, batch, len(rows), with_lm)
    return rewards[: len(rows)], rewards[len(rows) :], nll, count


def _pair_outputs(model: ScalarHeadModel, batch: dict, b: int, with_lm: bool):
    """The rewards [2b] of a collated pair batch (chosen rows first) and, `with_lm`, the LM NLL sum and
    count on the chosen responses: one forward of the trunk, both heads on its hidden states."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    hidden = model.hidden_states(ids, attn)
    # the reward at each row's last real token; a sum over that one column, not a view (FSDP2 warns
    # of a view returned from a sharded module's forward)
    rewards = model.values_from_hidden(hidden).gather(1, last_token_index(attn).unsqueeze(1)).sum(1)
    nll, count = rewards.new_zeros(()), 0
    if with_lm:  # the LM head only on the chosen rows' response tokens, in chunks (lm_loss.py)
        nll, count = hidden_token_nll(model.causal_lm, hidden[:b], ids[:b], batch["response_mask"][:b])
    return rewards, nll, count


def pair_step(
    learner: Learner, rows: list[EncodedPair], pad_id: int, lm_coef: float, precision: Precision | None = None
) -> dict:
    """One optimizer step on a step's pairs (rlhf/train/learner.py `Learner.step`); its metrics.

    The loss is the ranking loss summed over the step's pairs / their count, plus `lm_coef` x the NLL
    summed over the step's chosen tokens / their count: exact whatever the micro-batches and ranks.
    """
    with_lm = lm_coef > 0
    chosen_tokens = sum(len(r.chosen_ids) for r in rows)

    def loss(micro: MicroBatch):
        chosen, rejected, nll, _ = pair_forward(learner.call, micro.rows, pad_id, with_lm, precision)
        rank = ranking_loss(chosen, rejected)
        # pair mean and chosen-token mean over the whole step: two denominators, so the sums here
        value = rank / len(rows) + (lm_coef * nll / chosen_tokens if with_lm else 0.0)
        margin = (chosen - rejected).detach()
        return value, {
            "rank": rank.detach(),
            "lm": nll.detach(),
            "correct": (margin > 0).sum(),
            "margin": margin.sum(),
        }

    sums, grad_norm = learner.step(
        RowList(rows, pair_positions), loss, sums=("rank", "lm", "correct", "margin")
    )
    lm_mean = sums["lm"] / chosen_tokens
    metrics = {
        "train/loss": sums["rank"] / len(rows) + (lm_coef * lm_mean if with_lm else 0.0),
        "train/rank_loss": sums["rank"] / len(rows),
        "train/accuracy": sums["correct"] / len(rows),
        "train/margin_mean": sums["margin"] / len(rows),
        "train/pairs": len(rows),
        **step_metrics("train", grad_norm),
    }
    if with_lm:
        metrics["train/lm_ppl"] = math.exp(min(lm_mean, 50.0))
    return metrics


def ranking_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Sum over pairs of -log sigmoid(r_w - r_l) (the caller divides by the batch's pair count)."""
    return -F.logsigmoid(chosen - rejected).sum()


def pair_positions(row: EncodedPair) -> int:
    """A pair's computed positions: its chosen and rejected rows share one padded forward, each
    padded to the longer side (what `train.micro_batch_tokens` counts; sorting by it is sorting by
    the longer side)."""
    return 2 * row.positions


@torch.no_grad()
def evaluate_pairs(
    model: ScalarHeadModel,
    rows: list[EncodedPair],
    pad_id: int,
    batch_size: int,
    with_lm: bool,
    precision: Precision | None = None,
    by_length: bool = False,
    tokens: int | None = None,
) -> dict:
    """Accuracy (r_w > r_l), margins, ranking loss and the LM perplexity on held-out pairs, every
    pair here (rlhf/train/micro_batches.py `forward_passes`). `by_length`: pairs batched by length (less
    padding); `tokens`: pairs batched by a token budget (`train.micro_batch_tokens`); the margins
    stay in the order of `rows`."""
    model.eval()
    margin = torch.zeros(len(rows))

    def score(micro: MicroBatch) -> dict:
        chosen, rejected, nll, count = pair_forward(model, micro.rows, pad_id, with_lm, precision)
        margin[micro.index] = (chosen - rejected).float().cpu()
        return {"nll": nll, "tokens": count}

    split = partial(split_rows, size=batch_size, by_length=by_length, tokens=tokens)
    sums = forward_passes(RowList(rows, pair_positions), score, split, sums=("nll", "tokens"))
    out = {
        "accuracy": float((margin > 0).float().mean()) if len(margin) else 0.0,
        "margin_mean": float(margin.mean()) if len(margin) else 0.0,
        "margin_std": float(margin.std()) if len(margin) > 1 else 0.0,
        "rank_loss": float(-F.logsigmoid(margin).mean()) if len(margin) else 0.0,
        "margins": [round(float(m), 4) for m in margin],  # the distribution (PPO paper Fig. 2)
    }
    if with_lm:
        out["lm_ppl"] = math.exp(min(sums["nll"] / max(sums["tokens"], 1), 50.0))
    return out


def plan_batches(
    rows: list[EncodedPair], config: RewardConfig, generator: torch.Generator
) -> list[list[int]]:
    """One epoch of pair-index batches: fixed pair count, or about `max_tokens` tokens each. With
    `train.group_by_length across_steps`, fixed-count batches hold pairs of similar length."""
    t = config.train
    order = torch.randperm(len(rows), generator=generator).tolist()
    if t.batching == "tokens":  # already batches of similar length (token_budget_batches sorts)
        lengths = [rows[i].num_tokens for i in order]
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        return [
            [order[j] for j in batch]
            for batch in token_budget_batches(
                lengths, t.max_tokens, max_batch=t.max_batch, seed=seed, min_batch=t.min_batch
            )
        ]
    if t.group_by_length == "across_steps":  # HF group_by_length (rlhf.data.length_grouping)
        order = length_grouped_order(order, [r.positions for r in rows], t.batch_size, generator)
    return [order[i : i + t.batch_size] for i in range(0, len(order), t.batch_size)]


class RewardModelStage(SupervisedStage):
    """Pairwise ranking loss (+ lm_coef x the chosen responses' LM loss), evaluated by held-out
    accuracy; the best checkpoint by that accuracy is the one left in the run directory."""

    title = "Reward model"
    command = "rm"
    data_kind = "preference"
    key_metrics = ("train/loss", "train/accuracy", "eval/accuracy")

    def __init__(self, config: RewardConfig) -> None:
        super().__init__(config)
        self.best = {"accuracy": -1.0, "step": -1}

    def build_model(self, model, precision: Precision, on_meta: bool = False):
        if model is None:
            loaded = load_causal_lm(self.config.model, gguf_file=self.config.gguf_file, on_meta=on_meta)
            model = ScalarHeadModel.from_causal_lm(with_lora(loaded, self.config.lora))
        return placed(precision, model)

    def encode(self, tokenizer, examples, stats: TruncationStats) -> list[EncodedPair]:
        return encode_pairs(tokenizer, examples, self.config, stats)

    def schedule(self, rows, generator):
        t = self.config.train
        epochs = max(1, math.ceil(t.epochs))
        plan = [b for _ in range(epochs) for b in plan_batches(rows, self.config, generator)]
        steps = t.max_steps or max(1, math.ceil(len(plan) * t.epochs / epochs))
        return steps, iter((plan * math.ceil(steps / max(len(plan), 1)))[:steps])

    def positions(self, row: EncodedPair) -> int:
        return row.positions

    def train_step(self, run: SupervisedRun, rows: list[EncodedPair]) -> dict:
        return pair_step(run.learner, rows, run.pad_id, self.config.train.lm_coef, run.precision)

    def evaluate(self, run: SupervisedRun, rows: list[EncodedPair], step: int | None = None) -> dict:
        t = self.config.train  # every rank evaluates every pair (the margins keep their order; in lockstep)
        by_length = t.group_by_length != "none"
        result = evaluate_pairs(
            run.call, rows, run.pad_id, t.micro_batch_size, t.lm_coef > 0, run.precision, by_length,
            t.micro_batch_tokens,
        )  # fmt: skip
        if step is not None and result["accuracy"] > self.best["accuracy"]:  # the best held-out accuracy
            self.best = {"accuracy": result["accuracy"], "step": step}
            with run.learner.whole_copy(run.model) as model:  # fsdp2: every rank gathers, rank 0 saves
                if run.writer:
                    save_reward_model(model, run.tokenizer, run.out / "best")
        return result

    def finish(self, run: SupervisedRun, final: dict, stats: TruncationStats) -> dict:
        final["best_step"], final["best_accuracy"] = self.best["step"], self.best["accuracy"]
        final.update({f"data/{k}": v for k, v in stats.as_dict().items()})  # truncation, as every stage
        if self.best["step"] < 0:
            with run.learner.whole_copy(run.model) as model:  # fsdp2: every rank gathers, rank 0 saves
                if run.writer:
                    save_reward_model(model, run.tokenizer, run.out)
        elif run.writer:
            for item in (run.out / "best").iterdir():  # promote the best checkpoint to the run directory
                target = run.out / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                item.replace(target)
            shutil.rmtree(run.out / "best", ignore_errors=True)
        return final


def run_reward_training(config: RewardConfig, **inputs: Unpack[StageInputs]) -> dict:
    """Train, keep the best held-out checkpoint in `config.out`, return the final metrics
    (rlhf/train/supervised/ runs the stage).

    `train_rows` / `test_rows` replace the pairs read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    """
    return run_supervised(RewardModelStage(config), **inputs)


def save_reward_model(model: ScalarHeadModel, tokenizer, directory: Path) -> None:
    """Atomic `save_pretrained` with the tokenizer beside it: float32 weights, LoRA adapters merged
    (a copy is saved when either changes the model being trained); the other files of `directory`,
    such as a run's metrics, stay."""
    export_models(directory, tokenizer, {"": model})
