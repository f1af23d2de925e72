"""The policy role: samples responses, gives their log-probs, trains on the policy loss. Its
`train_step` is the policy side of one update on a minibatch, each term behind its own switch:

    policy loss      ratio and clip (or APA, AWR) of `policy.loss`           rlhf/core/losses.py
    entropy          - entropy_coef * H, or the gate around entropy_target   PPO paper §5.3.2, app. B.3
    KL in the loss   + kl_loss_coef * KL(pi || ref)   (GRPO's placement)     docs/algorithms.md §28
    value loss       + value_coef * clipped value loss (`critic_mode shared`) docs/algorithms.md §15
    PPO-ptx          + ptx_coef * the SFT loss on other rows                 docs/algorithms.md §17
    online DPO       the pairs' DPO loss, rows weighed on the whole minibatch docs/algorithms.md §45
It holds its learner (rlhf/train/learner.py): micro-batches, token weights, clipping, the NaN guard."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from rlhf.config import PolicyLossConfig
from rlhf.core import (
    covariance_selection,
    entropy_target_gate,
    entropy_target_loss,
    kl_estimate,
    loss_unit_count,
    masked_mean,
    policy_loss,
    policy_loss_params,
    policy_loss_unit,
    value_loss,
)
from rlhf.data.collate import PtxBatches, left_pad
from rlhf.models.precision import Precision
from rlhf.models.sampling import Rollout, RowShare, SamplingConfig
from rlhf.models.sequences import Sequences
from rlhf.parallel.peers import Peers
from rlhf.rl.experience import Experience, scored_in_chunks, valid_tokens
from rlhf.rl.online_dpo import pair_weighted
from rlhf.rl.roles.forward import JointForward, PolicyForward, ValueForward
from rlhf.train.learner import Learner, Training
from rlhf.train.micro_batches import MicroBatch
from rlhf.train.optimizer import step_metrics
from rlhf.train.step_stats import StepStats


@dataclass
class PtxObjective:
    """PPO-ptx (InstructGPT): `coef` x the SFT loss on batches drawn from `batches` with
    `generator`, beside the RL loss, against the alignment tax (docs/algorithms.md#17-ppo-ptx)."""

    batches: PtxBatches
    coef: float
    generator: torch.Generator


@dataclass
class JointValue:
    """A value head on the policy's trunk (`model.critic_mode shared`): its loss, weighted by
    `coef`, joins the policy loss in the policy's optimizer step."""

    forward: ValueForward
    coef: float
    value_clip: float | None


class Policy:
    """The causal LM `model` and its `learner` (AdamW, micro-batches and data parallelism as
    `training` says), sampling with `sampling`, trained on `loss`."""

    prefix = "policy"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        loss: PolicyLossConfig,
        sampling: SamplingConfig,
        training: Training,
        joint_value: JointValue | None = None,
        precision: Precision | None = None,
        sample_seed: int = 0,
    ) -> None:
        self.model = model  # the causal LM (a PEFT model when LoRA is on)
        self.home = training.device  # where its batches go (None: its parameters' device)
        self.tokenizer = tokenizer
        self.loss = loss
        self.sampling = sampling
        self.precision = precision
        self.forward = PolicyForward(model, precision)
        self.joint_value = joint_value
        self.ptx: PtxObjective | None = None
        self.stop_ids: list[int] | None = None  # ids that end a response (None: the tokenizer's EOS)
        # the module every forward goes through (what a sharded policy gathers): the policy's forward,
        # with the value head on its trunk when the critic is shared (`learner.module(..., part="value")`)
        trained = self.forward if joint_value is None else JointForward(self.forward, joint_value.forward)
        # a value head is left out of the policy's passes (uses_every_parameter: ddp's unused walk)
        self.learner = Learner.build(trained, training, uses_every_parameter=joint_value is None)
        # the rollouts' random draws, on the device where it samples: the policy's own state, saved
        # in checkpoints ("sample"), never passed in by a caller
        self.generator = torch.Generator(self.device).manual_seed(sample_seed)

    @property
    def device(self) -> torch.device:
        """Where the policy computes: the run's device (a sharded rank's model may still be on the
        meta device or the CPU before its shards move there)."""
        return self.home if self.home is not None else next(self.model.parameters()).device

    # -- inference -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        return_logprobs: bool,
        share: RowShare | None = None,
        all_ranks_done: Callable[[bool], bool] | None = None,
        *,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """One sampled response per prompt (token ids), in the rollout layout; with `share`, for
        those rows only (padded as the whole batch, drawing the whole batch's uniforms);
        `all_ranks_done`: the ranks decode in lockstep (rlhf.models.sampling.generate).
        `sampling` and `generator` replace the rollouts' own (a held-out evaluation's sampling,
        drawn without touching the rollouts' random state)."""
        tok, device = self.tokenizer, self.device
        ids, mask = left_pad(prompts, tok.pad_token_id)
        if share is not None:
            ids, mask = ids[share.start : share.stop], mask[share.start : share.stop]
        module = cast("PolicyForward | JointForward", self.learner.module)  # what __init__ trains
        return module.sample(
            ids.to(device),
            mask.to(device),
            sampling or self.sampling,
            eos_token_id=self.stop_ids or tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            generator=generator or self.generator,
            return_logprobs=return_logprobs,
            share=share,
            all_ranks_done=all_ranks_done,
        )

    @torch.no_grad()
    def logprobs(self, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        """Log-probs [B, T] of the response tokens at `temperature` (None: the sampling temperature;
        0 at padding)."""
        temperature = self.sampling.temperature if temperature is None else temperature
        module = self.learner.module
        return scored_in_chunks(lambda s: module(s, temperature)[0], sequences, self.learner.batching, module)

    # -- training ------------------------------------------------------------------------------
    def train_step(
        self, minibatch: Experience, total_tokens: float | None = None, total_rows: float | None = None
    ) -> dict[str, float]:
        """One optimizer step on `minibatch` (every rank passes the whole minibatch: the engine takes
        this rank's rows); `total_tokens`: the denominator of its token mean (`loss_denominator`);
        `total_rows`: of a row-mean loss (None: the minibatch's rows with a valid token)."""
        self.model.train(False)  # dropout stays off: the first ratio is exactly 1
        total = self.loss_denominator(minibatch) if total_tokens is None else total_tokens
        minibatch = self.with_cov_selection(minibatch)
        pair_metrics: dict[str, float] = {}
        if self.loss.loss == "online_dpo":  # pairs weighed on the whole minibatch, before any split (§45)
            minibatch, pair_metrics = pair_weighted(
                minibatch, self.logprobs(minibatch.sequences), self.loss.dpo
            )
        stats = StepStats()
        gate = self.entropy_gate(minibatch, total, stats)  # None: the plain entropy bonus
        # a loss that is a mean over rows (GSPO) is divided by the minibatch's rows with a valid token:
        # the same value and gradient for any split into micro-batches and ranks (algorithms.md §18)
        rows_total = None
        if policy_loss_unit(self.loss.loss) == "rows":
            rows_total = (
                loss_unit_count(minibatch.response_mask, "rows") if total_rows is None else total_rows
            )
        learner = self.learner
        micros = learner.micro_batches(minibatch, valid_tokens, total)
        joint = self.joint_value is not None
        passes = learner.passes(len(micros) * (2 if joint else 1) + (1 if self.with_ptx else 0))
        for micro in micros:
            with passes.next_pass():
                learner.backward(self.policy_terms(micro, stats, gate, rows_total), micro)
            if joint:  # a pass of its own: the policy's graph freed before it
                with passes.next_pass():
                    learner.backward(self.value_term(micro, stats), micro)
        learner.drop_weightless_gradients(total)
        if self.with_ptx:  # PPO-ptx: a pass on other rows, after the minibatch's
            with passes.next_pass():
                ptx_loss = self.ptx_term(stats)
                if ptx_loss is not None:
                    ptx_loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        grad_norm = learner.optimizer_step()
        return {**stats.result(learner.peers), **step_metrics("policy", grad_norm), **pair_metrics}

    def policy_terms(
        self,
        micro: MicroBatch,
        stats: StepStats,
        entropy_gate: float | None = None,
        rows_total: float | None = None,
    ) -> torch.Tensor:
        """This micro-batch's weighted policy loss, entropy term and KL-in-loss, its stats recorded:
        the bonus -entropy_coef * H (PPO paper §5.3.2), or entropy_coef * gate * H, whose gradient
        summed over the micro-batches is that of entropy_coef * max(|H - target| - clip, 0) (PPO
        paper appendix B.3). `micro.weight` is the micro-batch's share of the step's tokens; with
        `rows_total` (a loss whose unit is rows) the policy loss is weighted by its share of the rows."""
        p, rows, weight = self.loss, micro.rows, micro.weight
        pg_weight = weight
        if rows_total is not None:  # the micro-batch's rows with a valid token over the minibatch's
            pg_weight = (
                0.0 if micro.filler else loss_unit_count(rows.response_mask, "rows") / max(rows_total, 1.0)
            )
        entropy_weight = -p.entropy_coef if entropy_gate is None else p.entropy_coef * entropy_gate
        logp, entropy = self.learner.train_forward(  # a training pass (under ddp: through DDP)
            rows.sequences,
            self.sampling.temperature,
            with_entropy=True,
            entropy_grad=entropy_weight != 0,  # otherwise a monitor: no graph
        )
        # ratio pi/pi_old, clipped (PPO), or APA's / AWR's loss: `policy.loss`
        pg_loss, pg_stats = policy_loss(
            p.loss, logp, rows.old_logp, rows.ref_logp, rows.advantages, rows.response_mask,
            **policy_loss_params(p.loss, p), **cov_params(p, rows),
        )  # fmt: skip
        mean_entropy = masked_mean(entropy, rows.response_mask)
        stats.add({**pg_stats, "loss": pg_loss.detach()}, pg_weight, "policy")
        stats.add({"entropy": mean_entropy.detach()}, weight, "policy")
        # the engine weights the micro-batch by its token share; a row-mean loss by its row share instead
        pg_scale = 1.0 if rows_total is None else (pg_weight / weight if weight > 0 else 0.0)
        loss = pg_scale * pg_loss + entropy_weight * mean_entropy
        if p.kl_loss_coef > 0:  # KL to the reference in the loss, GRPO eq. 3 (docs/algorithms.md §28)
            kl = masked_mean(
                kl_estimate(logp, rows.ref_logp, p.kl_loss_estimator, rows.response_mask), rows.response_mask
            )
            stats.add({"kl_loss": kl.detach()}, weight, "policy")
            loss = loss + p.kl_loss_coef * kl
        return weight * loss

    def value_term(self, micro: MicroBatch, stats: StepStats) -> torch.Tensor:
        """The shared critic's value loss, clipped around the rollout's values when `critic.value_clip`
        is set, times `model.value_coef` (docs/algorithms.md#15-value-loss)."""
        v, learner = self.joint_value, self.learner
        assert v is not None  # a loss of the policy's step with a joint value only

        def values(sequences: Sequences) -> torch.Tensor:
            return learner.train_forward(sequences, part="value")  # type: ignore[no-any-return]

        loss = value_micro_loss(values, micro.rows, v.value_clip, stats, micro.weight)
        return micro.weight * v.coef * loss

    @torch.no_grad()
    def entropy_gate(self, minibatch: Experience, total_tokens: float, stats: StepStats) -> float | None:
        """With `policy.entropy_target`: the sign of d/dH of the clipped entropy term at the
        minibatch's token-mean entropy H (one gradient-free forward more per step); else None."""
        p = self.loss
        if p.entropy_target is None or p.entropy_coef == 0:
            return None
        parts: list[tuple[float, float]] = []

        def entropy(micro: MicroBatch) -> dict[str, Any]:
            h = self.learner.module(
                micro.rows.sequences, self.sampling.temperature, with_entropy=True, entropy_grad=False
            )[1]
            parts.append((micro.weight, float(masked_mean(h, micro.rows.response_mask))))
            return {}

        self.learner.forward_passes(minibatch, entropy, valid_tokens, total_tokens)
        mean_entropy = sum(w * h for w, h in parts) / max(sum(w for w, _ in parts), 1e-12)
        term = entropy_target_loss(torch.tensor(mean_entropy), p.entropy_target, p.entropy_clip)
        stats.add({"entropy_target_loss": term}, 1.0, "policy")
        return entropy_target_gate(mean_entropy, p.entropy_target, p.entropy_clip)

    def with_cov_selection(self, minibatch: Experience) -> Experience:
        """`policy.cov_control` clip_cov / kl_cov: the minibatch with its selected tokens (`cov_mask`),
        chosen on the whole minibatch before it is split (a batch statistic, as §18 requires) from
        the rollout's log-probs; Clip-Cov's draw seeded by the step's count, the same on every rank."""
        p = self.loss
        if p.cov_control == "none":
            return minibatch
        draw = torch.Generator().manual_seed(1_000_003 * self.learner.optimizer.steps_taken + 17)
        chosen = covariance_selection(
            minibatch.old_logp, minibatch.advantages, minibatch.response_mask, p.cov_control, p.cov_ratio,
            low=p.clip_cov_low, high=p.clip_cov_high, generator=draw,
        )  # fmt: skip
        return dataclasses.replace(minibatch, cov_mask=chosen.to(minibatch.response_mask.dtype))

    def loss_denominator(self, minibatch: Experience) -> float:
        """What the minibatch's summed token losses are divided by: its valid tokens (token mean), or
        rows x max_new_tokens under `policy.loss_aggregation: fixed_length` (Dr. GRPO,
        docs/algorithms.md §28)."""
        if self.loss.loss_aggregation == "fixed_length":
            return float(minibatch.batch_size * self.sampling.max_new_tokens)
        return minibatch.num_tokens

    def ptx_term(self, stats: StepStats) -> torch.Tensor | None:
        """PPO-ptx: the SFT objective, `coef`-weighted, beside the RL loss (a pass of its own); under
        data parallelism this rank's rows, the token mean over every rank's (None: no row here)."""
        ptx = self.ptx
        assert ptx is not None  # a pass of the step with PPO-ptx on only (`with_ptx`)
        batch = {k: v.to(self.device) for k, v in ptx.batches.draw(ptx.generator).items()}
        learner = self.learner
        if learner.peers is not None:
            batch = rank_rows(batch, learner.peers, learner.lockstep)
        nll, count = learner.train_forward(lm_batch=batch) if len(batch["input_ids"]) else (None, 0)
        total = count if learner.peers is None else learner.peers.sum(count)
        if nll is None:  # fewer PPO-ptx rows than ranks, none here
            return None
        stats.add({"loss": nll.detach() / max(count, 1)}, count / max(total, 1), "ptx")
        return ptx.coef * nll / max(total, 1)  # type: ignore[no-any-return]

    @property
    def with_ptx(self) -> bool:
        return self.ptx is not None and self.ptx.coef > 0

    def use_ptx(self, batches: PtxBatches, coef: float, seed: int) -> None:
        """PPO-ptx on: `coef` x the SFT loss on batches drawn from `batches`, its generator seeded `seed`."""
        self.ptx = PtxObjective(batches, coef, torch.Generator().manual_seed(seed))

    def state_dict(self) -> dict[str, Any]:
        state = self.learner.state_dict()
        state["sample_generator"] = self.generator.get_state()
        if self.ptx is not None:
            state["ptx_generator"] = self.ptx.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self.generator.set_state(state["sample_generator"])
        if self.ptx is not None and "ptx_generator" in state:
            self.ptx.generator.set_state(state["ptx_generator"])


def cov_params(p: PolicyLossConfig, rows: Experience) -> dict[str, Any]:
    """The ppo loss's Clip-Cov / KL-Cov parameters for these rows (docs/algorithms.md §43); {} when off."""
    if p.cov_control == "none":
        return {}
    if p.cov_control == "clip_cov":
        return {"cov_detach": rows.cov_mask}
    return {"cov_kl": rows.cov_mask, "cov_kl_coef": p.kl_cov_coef}


def value_micro_loss(
    forward: Callable[[Sequences], torch.Tensor],
    micro: Experience,
    value_clip: float | None,
    stats: StepStats,
    weight: float,
) -> torch.Tensor:
    """This micro-batch's value loss, clipped around the rollout's values when `value_clip` is set
    (docs/algorithms.md#15-value-loss); its stats recorded."""
    values = forward(micro.sequences)
    loss, loss_stats = value_loss(
        values, micro.old_values, micro.returns, micro.response_mask, clip_eps=value_clip
    )
    del loss_stats["explained_variance"]  # a ratio of variances: over the whole minibatch, in StepStats
    stats.add({**loss_stats, "loss": loss.detach()}, weight, "value")
    stats.add_values(values, micro.returns, micro.response_mask)
    return loss


def rank_rows(batch: dict[str, torch.Tensor], peers: Peers, lockstep: bool) -> dict[str, torch.Tensor]:
    """This rank's rows of a PPO-ptx batch; with `lockstep`, padded to the largest rank's share
    (`Peers.padded_share`) with rows whose loss mask is 0 (they weigh nothing)."""
    index, real = peers.padded_share(len(batch["input_ids"]))
    rows = {k: v[index if lockstep else index[:real]] for k, v in batch.items()}
    if lockstep:
        rows["loss_mask"][real:] = 0
    return rows
