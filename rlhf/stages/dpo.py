"""Direct preference optimization (`rlhf dpo`): the SFT model trained on preference pairs against
itself, frozen, as the reference (docs/algorithms.md §32; `dpo.loss` sigmoid | ipo | robust), or
against no reference at all (`dpo.loss simpo`: no reference is built, scored or cached).

Pairs are read as `rlhf rm` reads them. The reference is a frozen copy, or a LoRA policy's own
weights with the adapter off; its log-probs are computed once before training
(`dpo.precompute_reference`) or in every step. The step runs in the supervised skeleton
(rlhf/train/supervised/), sharded per layer under fsdp2. A checkpoint (`checkpoint.every`, `--resume`)
also holds the cached reference log-probs and a digest of the encoded pairs, so that a resume on
other data stops."""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlhf.config import ConfigError, DPOConfig
from rlhf.core import REFERENCE_FREE, preference_loss
from rlhf.data.collate import collate_pairs
from rlhf.data.tokenize import TruncationStats
from rlhf.models.device import model_device, to_device
from rlhf.models.loading import load_causal_lm
from rlhf.models.precision import Precision
from rlhf.models.reference import ReferenceModel
from rlhf.parallel.fsdp import shard_from_rank0
from rlhf.stages.rm import EncodedPair, encode_pairs, pair_positions
from rlhf.train.lm_loss import sequence_logprobs
from rlhf.train.micro_batches import MicroBatch, RowList
from rlhf.train.optimizer import step_metrics
from rlhf.train.setup import with_lora
from rlhf.train.supervised import StageInputs, SupervisedRun, SupervisedStage, placed, run_supervised
from rlhf.train.supervised.model_call import ModelCall, call_model

if TYPE_CHECKING:
    from typing_extensions import Unpack

STATS = ("chosen_reward", "rejected_reward", "margin", "accuracy", "chosen_logp", "rejected_logp")


@dataclass
class DPOPair(EncodedPair):
    ref_chosen: float | None = None  # the reference's summed log-probs, once computed
    ref_rejected: float | None = None


def pair_logprobs(
    model, rows: list[EncodedPair], pad_id: int, precision: Precision | None, per_token: bool = False
):
    """Summed response log-probs ([b] float32 each) of the chosen and the rejected responses
    (`model`: a causal LM, or its ModelCall); `per_token`: each divided by its response's tokens
    (EOS included), SimPO's length normalization."""
    batch = collate_pairs(
        [r.prompt_ids for r in rows], [r.chosen_ids for r in rows], [r.rejected_ids for r in rows], pad_id
    )
    batch = to_device(batch, model_device(model))
    with precision.autocast() if precision is not None else contextlib.nullcontext():
        logp = call_model(
            model, sequence_logprobs, batch["input_ids"], batch["attention_mask"], batch["response_mask"]
        )
    if per_token:
        logp = logp / batch["response_mask"].sum(-1).clamp(min=1).to(logp.dtype)
    return logp[: len(rows)], logp[len(rows) :]


class DPOStage(SupervisedStage):
    """A preference loss on the policy's and the reference's summed log-probs of each pair (SimPO:
    the policy's mean token log-probs, no reference)."""

    title = "DPO"
    command = "dpo"
    data_kind = "preference"
    key_metrics = ("train/loss", "train/accuracy", "eval/accuracy", "eval/margin")
    resumable = True
    uses_every_parameter = True  # the decoder and the output head in every pass

    def build_model(self, model, precision: Precision, on_meta: bool = False):
        c = self.config
        if model is None:
            model = load_causal_lm(c.model, gguf_file=c.gguf_file, on_meta=on_meta)
        model = placed(precision, with_lora(model, c.lora))
        # the SFT model, frozen: a LoRA policy's reference is its adapter switched off; none for SimPO
        self.reference = (
            None
            if c.dpo.loss in REFERENCE_FREE
            else ReferenceModel(model, mode="adapter" if c.lora.enabled else "copy")
        )
        self.reference_call: ModelCall | None = None  # its one call (before_training)
        return model

    def encode(self, tokenizer, examples, stats: TruncationStats) -> list[DPOPair]:
        return [
            DPOPair(r.prompt_ids, r.chosen_ids, r.rejected_ids)
            for r in encode_pairs(tokenizer, examples, self.config, stats)
        ]

    def positions(self, row: DPOPair) -> int:
        return row.positions

    def before_training(
        self, run: SupervisedRun, train_rows: list[DPOPair], test_rows: list[DPOPair], status
    ) -> None:
        if self.reference is None:
            return  # reference-free (SimPO)
        self.reference_call = self._reference_call(run)
        if self.config.dpo.precompute_reference:
            status("scoring every pair with the reference")
            for rows in (train_rows, test_rows):
                if any(r.ref_chosen is None for r in rows):  # a resumed run's came from its checkpoint
                    self.cache_reference(run, rows)

    def _reference_call(self, run: SupervisedRun) -> ModelCall:
        """The reference's one call: the policy's (adapter mode: its weights, the adapter switched off
        by `in_force`), or its copy's, sharded per layer without optimizer under fsdp2 (every rank's
        shards from rank 0's copy; offloaded as the policy under dist.offload)."""
        assert self.reference is not None  # built unless the loss is reference-free
        if self.reference.mode == "adapter":
            return run.call
        call = ModelCall(self.reference.model)
        if run.per_layer:
            bf16 = run.precision.uses_autocast
            shard_from_rank0(call, run.peers, bf16_compute=bf16, offload=run.learner.offload)
        return call

    def checkpoint_state(self, train_rows: list[DPOPair], test_rows: list[DPOPair]) -> dict:
        state: dict = {"pairs_sha256": pairs_digest(train_rows, test_rows)}
        for name, rows in (("train", train_rows), ("test", test_rows)):
            if rows and all(r.ref_chosen is not None for r in rows):
                state[f"reference_{name}"] = torch.tensor(
                    [[r.ref_chosen, r.ref_rejected] for r in rows], dtype=torch.float64
                )
        return state

    def restore_state(self, state: dict, train_rows: list[DPOPair], test_rows: list[DPOPair]) -> None:
        if state["pairs_sha256"] != pairs_digest(train_rows, test_rows):
            raise ConfigError(
                f"{self.config.out}: the pairs differ from those the checkpoint was trained on (data.path "
                f"{self.config.data.path} changed since). Fix: resume with the run's own data file, or start "
                "a new run (another --out)."
            )
        for name, rows in (("train", train_rows), ("test", test_rows)):
            cached = state.get(f"reference_{name}")
            if cached is not None:
                for row, (chosen, rejected) in zip(rows, cached.tolist()):
                    row.ref_chosen, row.ref_rejected = chosen, rejected

    def cache_reference(self, run: SupervisedRun, rows: list[DPOPair]) -> None:
        """Each rank scores its share of `rows` with the reference (`Learner.forward_passes`); the
        shares are joined so that every rank holds every pair's reference log-probs."""
        if not rows:
            return
        share = range(len(rows)) if run.peers is None else range(len(rows))[run.peers.rows(len(rows))]
        local = torch.zeros(len(share), 2, dtype=torch.float64)

        def score(micro: MicroBatch) -> dict:
            chosen, rejected = self.reference_logprobs(run, micro.rows)
            if not micro.filler:
                local[micro.index] = torch.stack([chosen, rejected], dim=1).double().cpu()
            return {}

        run.learner.forward_passes(RowList(rows, pair_positions), score)
        if run.peers is not None:
            local = run.peers.gather_rows(local.to(run.peers.device), len(rows)).cpu()
        for row, (chosen, rejected) in zip(rows, local.tolist()):
            row.ref_chosen, row.ref_rejected = chosen, rejected

    def reference_logprobs(
        self, run: SupervisedRun, rows: list[DPOPair]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if all(r.ref_chosen is not None for r in rows):
            device = model_device(run.model)
            return (
                torch.tensor([r.ref_chosen for r in rows], dtype=torch.float32, device=device),
                torch.tensor([r.ref_rejected for r in rows], dtype=torch.float32, device=device),
            )
        assert self.reference is not None  # built unless the loss is reference-free
        with self.reference.in_force():
            return pair_logprobs(self.reference_call, rows, run.pad_id, run.precision)

    def _figures(self, run: SupervisedRun, micro: MicroBatch) -> tuple[torch.Tensor, dict]:
        """The preference loss of a micro-batch's pairs (their mean) and its figures times its pairs."""
        d = self.config.dpo
        free = self.reference is None  # SimPO (Meng et al. 2024, eq. 6): mean token log-probs, no reference
        refs = (None, None) if free else self.reference_logprobs(run, micro.rows)
        chosen, rejected = pair_logprobs(run.call, micro.rows, run.pad_id, run.precision, per_token=free)
        gamma = d.simpo_gamma if free else 0.0
        loss, stats = preference_loss(d.loss, chosen, rejected, *refs, d.beta, d.label_smoothing, gamma=gamma)
        n = len(micro.rows)
        return loss, {key: float(value.detach()) * n for key, value in (("loss", loss), *stats.items())}

    def train_step(self, run: SupervisedRun, rows: list[DPOPair]) -> dict:
        def loss(micro: MicroBatch) -> tuple[torch.Tensor, dict]:
            value, figures = self._figures(run, micro)
            return value * micro.weight, figures  # the mean over the step's pairs

        batch = RowList(rows, pair_positions)
        sums, grad_norm = run.learner.step(batch, loss, len, len(rows), sums=("loss", *STATS))
        out = {f"train/{k}": v / len(rows) for k, v in sums.items()}
        return {**out, "train/pairs": len(rows), **step_metrics("train", grad_norm)}

    def evaluate(self, run: SupervisedRun, rows: list[DPOPair], step: int | None = None) -> dict:
        was_training = run.call.training
        run.call.eval()
        try:
            batch = RowList(rows, pair_positions)
            sums = run.learner.forward_passes(
                batch, lambda micro: self._figures(run, micro)[1], sums=("loss", *STATS)
            )
        finally:
            run.call.train(was_training)
        return {key: total / max(len(rows), 1) for key, total in sums.items()}


def pairs_digest(*groups: list[EncodedPair]) -> str:
    """sha256 over the token ids of every pair of `groups`, in order."""
    digest = hashlib.sha256()
    for rows in groups:
        digest.update(f"{len(rows)};".encode())
        for r in rows:
            digest.update(f"{r.prompt_ids}|{r.chosen_ids}|{r.rejected_ids};".encode())
    return digest.hexdigest()


def run_dpo(config: DPOConfig, **inputs: Unpack[StageInputs]) -> dict:
    """Train the policy of `config.model` by `config.dpo.loss` on the pairs of `config.data.path`,
    evaluate on the held-out pairs, export it to `config.out`; the final metrics. `resume`: go on
    from the newest checkpoint in `config.out` (`model`, when given, is the starting SFT model)."""
    return run_supervised(DPOStage(config), **inputs)
