"""Reward-model training (`rlhf rm`): pairwise ranking loss + beta_rm * LM loss on the chosen response.

    L_rank = -mean log sigmoid(r(x, y_w) - r(x, y_l))          (PPO paper sec. 4)
    L_RM   = L_rank + lm_coef * L_LM(chosen)                    (token-mean next-token CE)

The reward is read at the last real token (the EOS) from the attention mask. Pairs are batched by
count or by token budget (the paper's dynamic batches); the best checkpoint by held-out accuracy
is the one left in the run directory.

Devices and precision as in SFT (sft.py): model and batches on `train.device`, forwards under the
`dtype` policy, the scalar head and every loss in float32, checkpoints saved in float32.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rlhf.config import RewardConfig
from rlhf.data.chat import response_end_id
from rlhf.data.collate import collate_pairs, token_budget_batches
from rlhf.data.length_grouping import length_grouped_order, micro_batch_groups
from rlhf.data.loading import load_examples, split_examples
from rlhf.data.tokenize import TruncationStats, encode_prompt, encode_response
from rlhf.models.device import model_device, resolve_device, to_device
from rlhf.models.grad_checkpointing import gradient_checkpointing
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel, last_token_index
from rlhf.monitor import print_summary
from rlhf.rundir.directory import open_metrics_logger
from rlhf.rundir.export import export_models
from rlhf.rundir.final_report import write_final_report
from rlhf.runtime import fsdp
from rlhf.runtime.fsdp import gathered, shard_trained, whole_copies
from rlhf.runtime.peers import Peers, current_peers
from rlhf.train.lm_loss import hidden_token_nll
from rlhf.train.optim import build_optimizer, clip_and_step
from rlhf.train.setup import start_run, with_lora


@dataclass
class EncodedPair:
    prompt_ids: list[int]
    chosen_ids: list[int]  # EOS included
    rejected_ids: list[int]  # EOS included

    @property
    def num_tokens(self) -> int:
        return 2 * len(self.prompt_ids) + len(self.chosen_ids) + len(self.rejected_ids)


def encode_pairs(tokenizer, examples, config: RewardConfig, stats: TruncationStats) -> list[EncodedPair]:
    d = config.data
    rows = []
    for ex in examples:
        end = response_end_id(tokenizer, ex.prompt, d.chat_template)  # EOS, or the template's end of turn
        rows.append(
            EncodedPair(
                encode_prompt(tokenizer, ex.prompt, d.max_prompt_tokens, stats, d.chat_template),
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
    chosen responses; the batch on the model's device, forwards under `precision`."""
    batch = collate_pairs(
        [r.prompt_ids for r in rows], [r.chosen_ids for r in rows], [r.rejected_ids for r in rows], pad_id
    )
    batch = to_device(batch, model_device(model))
    ids, attn = batch["input_ids"], batch["attention_mask"]  # 2b rows, chosen first
    with precision.autocast() if precision is not None else contextlib.nullcontext():
        hidden = model.hidden_states(ids, attn)
        rewards = model.values_from_hidden(hidden).gather(1, last_token_index(attn).unsqueeze(1)).squeeze(1)
        b = len(rows)
        nll, count = rewards.new_zeros(()), 0
        if with_lm:  # the LM head only on the chosen rows' response tokens, in chunks (lm_loss.py)
            nll, count = hidden_token_nll(model.causal_lm, hidden[:b], ids[:b], batch["response_mask"][:b])
    return rewards[:b], rewards[b:], nll, count


def pair_step(
    model: ScalarHeadModel,
    rows: list[EncodedPair],
    pad_id: int,
    micro_batch_size: int,
    lm_coef: float,
    precision: Precision | None = None,
    by_length: bool = False,
    peers: Peers | None = None,
) -> dict:
    """Forward/backward one optimizer step's pairs in micro-batches (no optimizer step); its metrics.

    The loss is the ranking loss summed over the step's pairs / their count, plus `lm_coef` x the NLL
    summed over the step's chosen tokens / their count: exact whatever the micro-batches
    (`by_length`: pairs sorted by length before the split, rlhf.data.length_grouping). With `peers`
    (data parallelism) this rank takes its share of the pairs; gradients and sums cover every rank's.
    """
    with_lm = lm_coef > 0
    chosen_tokens = sum(len(r.chosen_ids) for r in rows)
    rank_sum, lm_sum, correct, margin_sum = 0.0, 0.0, 0, 0.0
    mine = rows if peers is None else rows[peers.rows(len(rows))]  # the means stay over `rows`
    for group in pair_micro_batches(mine, micro_batch_size, by_length):
        chosen, rejected, nll, _ = pair_forward(model, [mine[i] for i in group], pad_id, with_lm, precision)
        rank = ranking_loss(chosen, rejected)
        loss = rank / len(rows) + (lm_coef * nll / chosen_tokens if with_lm else 0.0)
        loss.backward()  # pair mean and chosen-token mean over the whole step
        rank_sum += float(rank.detach())
        lm_sum += float(nll.detach())
        correct += int((chosen > rejected).sum())
        margin_sum += float((chosen - rejected).detach().sum())
    if peers is not None:  # every rank's pairs: summed gradients (clipped by the global norm), stats
        peers.sum_gradients(list(model.parameters()))
        rank_sum, lm_sum, correct, margin_sum = peers.sums([rank_sum, lm_sum, correct, margin_sum])
    metrics = {
        "train/loss": rank_sum / len(rows) + (lm_coef * lm_sum / chosen_tokens if with_lm else 0.0),
        "train/rank_loss": rank_sum / len(rows),
        "train/accuracy": correct / len(rows),
        "train/margin_mean": margin_sum / len(rows),
        "train/pairs": len(rows),
    }
    if with_lm:
        metrics["train/lm_ppl"] = math.exp(min(lm_sum / chosen_tokens, 50.0))
    return metrics


def ranking_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Sum over pairs of -log sigmoid(r_w - r_l) (the caller divides by the batch's pair count)."""
    return -F.logsigmoid(chosen - rejected).sum()


def pair_micro_batches(rows: list[EncodedPair], size: int, by_length: bool) -> list[list[int]]:
    """Positions of `rows` cut into micro-batches of `size` pairs; `by_length`: longest first. A pair's
    chosen and rejected rows share one padded forward, so a pair counts as its longer side."""
    lengths = [len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)) for r in rows]
    return micro_batch_groups(lengths, size, by_length)


@torch.no_grad()
def evaluate_pairs(
    model: ScalarHeadModel,
    rows: list[EncodedPair],
    pad_id: int,
    batch_size: int,
    with_lm: bool,
    precision: Precision | None = None,
    by_length: bool = False,
) -> dict:
    """Accuracy (r_w > r_l), margins, ranking loss and the LM perplexity on held-out pairs.
    `by_length`: pairs batched by length (less padding); the margins stay in the order of `rows`."""
    model.eval()
    margin = torch.zeros(len(rows))
    nll_sum, count = 0.0, 0
    for group in pair_micro_batches(rows, batch_size, by_length):
        chosen, rejected, nll, n = pair_forward(model, [rows[i] for i in group], pad_id, with_lm, precision)
        margin[group] = (chosen - rejected).float().cpu()
        nll_sum, count = nll_sum + float(nll), count + n
    out = {
        "accuracy": float((margin > 0).float().mean()) if len(margin) else 0.0,
        "margin_mean": float(margin.mean()) if len(margin) else 0.0,
        "margin_std": float(margin.std()) if len(margin) > 1 else 0.0,
        "rank_loss": float(-F.logsigmoid(margin).mean()) if len(margin) else 0.0,
        "margins": [round(float(m), 4) for m in margin],  # the distribution (PPO paper Fig. 2)
    }
    if with_lm:
        out["lm_ppl"] = math.exp(min(nll_sum / max(count, 1), 50.0))
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
        lengths = [len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)) for r in rows]
        order = length_grouped_order(order, lengths, t.batch_size, generator)
    return [order[i : i + t.batch_size] for i in range(0, len(order), t.batch_size)]


def run_reward_training(
    config: RewardConfig,
    *,
    model: ScalarHeadModel | None = None,
    tokenizer=None,
    train_rows: list[EncodedPair] | None = None,
    test_rows: list[EncodedPair] | None = None,
    quiet: bool = False,
) -> dict:
    """Train, keep the best held-out checkpoint in `config.out`, return the final metrics.

    `train_rows` / `test_rows` replace the pairs read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    """
    device = resolve_device(config.train.device, key="train.device")
    precision = Precision.resolve(config.dtype, device, key="dtype")
    peers = current_peers()  # torchrun: this rank's share of every batch (rlhf/runtime/peers.py)
    writer = peers is None or peers.rank == 0
    out, tokenizer = start_run(config, tokenizer, writer=writer)
    if model is None:
        lm = with_lora(load_causal_lm(config.model, gguf_file=config.gguf_file), config.lora)
        model = ScalarHeadModel.from_causal_lm(lm)
    precision.prepare(model)
    if peers is not None:
        peers.broadcast_parameters(model.parameters())  # one start for every rank
    if config.gradient_checkpointing:
        gradient_checkpointing(model)
    stats = TruncationStats()
    if train_rows is None:
        loaded = load_examples(
            config.data.path,
            kind="preference",
            format=config.data.format,
            skip_invalid=config.data.skip_invalid,
        )
        train_ex, test_ex = split_examples(loaded.examples, config.data.test_fraction, seed=config.seed)
        train_rows = encode_pairs(tokenizer, train_ex, config, stats)
        if test_rows is None:
            test_rows = encode_pairs(tokenizer, test_ex, config, stats)
    test_rows = test_rows or []
    if not train_rows:
        raise ValueError(
            "no training preference pairs: the data left nothing to train on. Fix: check data.path."
        )
    t = config.train
    with_lm = t.lm_coef > 0
    by_length = t.group_by_length != "none"  # micro-batches of similar-length pairs (length_grouping.py)
    pad_id = tokenizer.pad_token_id
    generator = torch.Generator().manual_seed(config.seed)  # data order: on the CPU, the same everywhere
    epochs = max(1, math.ceil(t.epochs))
    plan = [b for _ in range(epochs) for b in plan_batches(train_rows, config, generator)]
    steps = t.max_steps or max(1, math.ceil(len(plan) * t.epochs / epochs))
    plan = (plan * math.ceil(steps / max(len(plan), 1)))[:steps]
    optimizer, scheduler = build_optimizer(model.parameters(), config.optim, steps)
    sharded = shard_trained(config.dist.strategy, model, optimizer, peers)  # fsdp2: [model]
    logger = open_metrics_logger(
        out,
        resumable=False,
        sinks=tuple(config.sinks),  # `quiet` only drops the final summary table
        total=steps,
        key_metrics=("train/loss", "train/accuracy", "eval/accuracy"),
        writer=writer,
    )
    best = {"accuracy": -1.0, "step": -1}
    final: dict = {}
    with logger:
        for step, indices in enumerate(plan):
            model.train()
            rows = [train_rows[i] for i in indices]
            with gathered(sharded):  # fsdp2: the whole model for the step's micro-batches
                metrics = pair_step(
                    model, rows, pad_id, t.micro_batch_size, t.lm_coef, precision, by_length, peers
                )
                if sharded:  # summed by pair_step: cut to this rank's shard, clipped by the global norm
                    metrics["train/grad_norm"] = fsdp.step(
                        sharded[0], optimizer, scheduler, peers, config.optim.max_grad_norm, summed=True
                    )
            if not sharded:
                metrics["train/grad_norm"] = clip_and_step(
                    optimizer, scheduler, model.parameters(), config.optim.max_grad_norm
                )
            metrics["train/lr"] = scheduler.get_last_lr()[0]
            last = step == steps - 1
            if test_rows and (last or (t.eval_every and (step + 1) % t.eval_every == 0)):
                with gathered(sharded):
                    result = evaluate_pairs(
                        model, test_rows, pad_id, t.micro_batch_size, with_lm, precision, by_length
                    )
                metrics.update({f"eval/{k}": v for k, v in result.items()})
                if result["accuracy"] > best["accuracy"]:  # keep the best checkpoint by held-out accuracy
                    best = {"accuracy": result["accuracy"], "step": step}
                    with whole_copies(sharded):  # fsdp2: every rank gathers, rank 0 saves
                        if writer:
                            save_reward_model(model, tokenizer, out / "best")
            if last or step % t.log_every == 0 or "eval/accuracy" in metrics:
                logger.log(step, metrics, kind="step")
            final = metrics
    model.eval()
    final["best_step"], final["best_accuracy"] = best["step"], best["accuracy"]
    if best["step"] < 0:
        with whole_copies(sharded):  # fsdp2: every rank gathers, rank 0 saves
            if writer:
                save_reward_model(model, tokenizer, out)
    if not writer:
        return final  # rank 0 saves, reports and prints
    if best["step"] >= 0:
        for item in (out / "best").iterdir():  # promote the best checkpoint to the run directory
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
        shutil.rmtree(out / "best", ignore_errors=True)
    report = write_final_report(out)
    if not quiet:
        shown = {k: v for k, v in final.items() if not isinstance(v, list)}
        print_summary(f"Reward model finished: {out}", shown)
        print(f"report: {report}")  # a line of its own: the table would cut a long path
    return final


def save_reward_model(model: ScalarHeadModel, tokenizer, directory: Path) -> None:
    """Atomic `save_pretrained` with the tokenizer beside it: float32 weights, LoRA adapters merged
    (a copy is saved when either changes the model being trained); the other files of `directory`,
    such as a run's metrics, stay."""
    export_models(directory, tokenizer, {"": model})
