"""The RL loop: PPO, PPO-max, APA and AWR in one trainer.

One iteration (DESIGN.md, "The data flow of one RL iteration"):

    rollout   sample responses to a batch of prompts                 (policy, no grad)
    score     reward model at the last real token                    (reward model, no grad)
    forward   old log-probs, reference log-probs, values             (policy, reference, critic, no grad)
    advantage processed scores -> token rewards with KL -> GAE
    update    epochs x minibatches of policy loss + value loss (+ entropy, + ptx)

Every trick of the PPO paper is one named step below, switched by its own config field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from rlhf.config import ConfigError, RLConfig, save_config
from rlhf.core import (
    AdaptiveKLController,
    FixedKLController,
    ScoreProcessor,
    gae,
    kl_estimate,
    masked_mean,
    masked_sum,
    masked_var,
    policy_loss,
    token_rewards,
    value_loss,
    whiten_advantages,
)
from rlhf.data.collate import left_pad
from rlhf.models.backbone import causal_lm_parts, forward_changes_state
from rlhf.models.logprobs import response_logprobs
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.scalar_head import response_values
from rlhf.models.truncation import apply_truncation_policy
from rlhf.monitor import CollapseDetector
from rlhf.train import checkpoint as ckpt
from rlhf.train.allocator import keep_freed_memory
from rlhf.train.concurrency import (
    MIN_SPLIT_FORWARD_FLOPS,
    by_row_halves,
    forward_flops,
    handover_step,
    run_side_by_side,
    side_by_side_threads,
    training_flops_per_token,
)
from rlhf.train.experience import Experience, concat_experiences, forward_in_chunks
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.metrics import distinct_n
from rlhf.train.optim import build_optimizer, clip_and_step
from rlhf.train.prompts import PromptStream
from rlhf.train.roles import Roles
from rlhf.train.run_dir import open_metrics_logger, quiet_hf_saves


class UpdateStats:
    """Token-weighted means of per-micro-batch stats; `*_max`/`*_min` keys combine by max/min;
    gradient norms are averaged over optimizer steps."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.grad_norms: dict[str, list[float]] = {}

    def add(self, stats: dict, weight: float, prefix: str) -> None:
        for k, v in stats.items():
            key = f"{prefix}/{k}"
            if k.endswith("_max") or k.endswith("_min"):
                pick = max if k.endswith("_max") else min
                self.extremes[key] = pick(self.extremes.get(key, float(v)), float(v))
                continue
            self.sums[key] = self.sums.get(key, 0.0) + float(v) * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def add_grad_norm(self, key: str, norm: float) -> None:
        self.grad_norms.setdefault(key, []).append(norm)

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / max(self.weights[k], 1e-12) for k in self.sums}
        out.update(self.extremes)
        out.update({k: sum(v) / len(v) for k, v in self.grad_norms.items() if v})
        return out


KEY_METRICS = ("reward/raw_mean", "kl/ref", "policy_ppl", "response/length_mean", "policy/clip_fraction")
Evaluator = Callable[["RLTrainer", int], dict]


def on_cpu(*models: torch.nn.Module) -> bool:
    """Every parameter of `models` on the CPU (threads side by side only help there)."""
    return all(q.device.type == "cpu" for m in models for q in m.parameters())


class RLTrainer:
    """Owns the roles, optimizers and running statistics of one RL run."""

    def __init__(
        self,
        config: RLConfig,
        roles: Roles,
        prompts: list[list[int]],
        *,
        ptx_batches: Callable[[torch.Generator], dict] | None = None,
        evaluator: Evaluator | None = None,
        run_dir: str | Path | None = None,
        resume: bool = False,
        quiet: bool = False,
    ):
        self.config = config
        self.roles = roles
        self.run_dir = Path(run_dir or config.out)
        self.evaluator = evaluator
        self.ptx_batches = ptx_batches
        c = config
        torch.manual_seed(c.seed)
        if c.train.keep_freed_memory:
            keep_freed_memory()
        self.prompts = PromptStream(prompts, seed=c.seed)
        self.sample_generator = torch.Generator().manual_seed(c.seed + 1)
        self.shuffle_generator = torch.Generator().manual_seed(c.seed + 2)
        self.sampling = SamplingConfig(
            max_new_tokens=c.rollout.max_new_tokens,
            temperature=c.rollout.temperature,
            top_p=c.rollout.top_p,
            top_k=c.rollout.top_k,
            repetition_penalty=c.rollout.repetition_penalty,
            do_sample=True,
            stop_at_eos=c.rollout.stop_at_eos,
            drop_finished_rows=c.rollout.drop_finished_rows,
            pack_weights=c.rollout.pack_weights,
        )
        # score reparameterization: scaling / normalization / clipping, each its own switch (sec. 5.3.1)
        self.score_processor = ScoreProcessor(
            scale=c.reward.scale,
            normalize=c.reward.normalize,
            clip=c.reward.clip,
            discounted=c.reward.discounted,
            gamma=c.reward.discount_gamma,
        )
        # token-level KL penalty with a fixed or adaptive coefficient (sec. 5.3.2; Ziegler et al. 2019)
        self.kl_controller = (
            AdaptiveKLController(c.kl.beta, c.kl.target, c.kl.horizon)
            if c.kl.adaptive
            else FixedKLController(c.kl.beta)
        )
        self.shared_critic = c.model.critic_mode == "shared"
        steps_per_iter = c.train.ppo_epochs * c.train.minibatches
        total = max(1, c.train.iterations * steps_per_iter)
        pretrain_steps = c.critic.pretrain_iterations * steps_per_iter
        policy_params = list(roles.policy.parameters())
        if self.shared_critic:  # one optimizer; critic pre-training steps only the value head
            policy_params += list(roles.critic.head.parameters())
            total += pretrain_steps
        self.policy_opt, self.policy_sched = build_optimizer(policy_params, c.policy_optim, total)
        if not self.shared_critic:
            self.critic_opt, self.critic_sched = build_optimizer(
                roles.critic.parameters(), c.critic_optim, total + pretrain_steps
            )
        self.buffer: list[Experience] = []
        self.iteration = 0
        self.pretrain_done = c.critic.pretrain_iterations == 0
        self.pretrain_state = {"iterations": 0, "best": math.inf, "stale": 0}
        col = c.log.collapse
        self.detector = CollapseDetector(
            window=col.window,
            baseline_steps=col.baseline_steps,
            kl_rise=col.kl_rise,
            kl_floor=col.kl_floor,
            ppl_drop=col.ppl_drop,
            length_drift=col.length_drift,
            patience=col.patience,
            kl_key="kl/ref",
            ppl_key="policy_ppl",
            length_key="response/length_mean",
            diversity_drop=col.diversity_drop,
            diversity_key="response/distinct2",
        )
        if ptx_batches is None and c.policy.ptx_coef > 0:
            self.ptx_note = "PPO-ptx is off: policy.ptx_coef > 0 but no data.ptx was given."
        else:
            self.ptx_note = None
        self.ptx_generator = torch.Generator().manual_seed(c.seed + 3)
        if resume:
            found = ckpt.list_checkpoints(self.run_dir)
            if not found:
                raise ConfigError(
                    f"{self.run_dir} has no complete checkpoint to resume from (checkpoints/iter_*/DONE). "
                    "Fix: start a fresh run with another --out, or set checkpoint.every to save during a run."
                )
            self.load_checkpoint(found[-1])
        self.logger = open_metrics_logger(
            self.run_dir,
            resumable=True,
            sinks=tuple(c.log.sinks) if not quiet else ("jsonl",),
            total=c.train.iterations,
            key_metrics=KEY_METRICS,
            resume=resume,
            resume_step=self.iteration - 1 if resume else None,
        )

    # ----------------------------------------------------------------------------------------
    # the loop
    # ----------------------------------------------------------------------------------------
    def train(self) -> dict:
        c = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(c, self.run_dir / "config.yaml")
        if self.ptx_note and self.iteration == 0:
            self.logger.warn(self.ptx_note, step=0)
        last: dict = {}
        try:
            while not self.pretrain_done:  # critic pre-training: value loss only, policy frozen (sec. 5.3.4)
                self.pretrain_step()
            while self.iteration < c.train.iterations:
                last = self.step()
                self.iteration += 1
                if last.get("stop"):
                    break
                if c.checkpoint.every and self.iteration % c.checkpoint.every == 0:
                    self.save_checkpoint()
            self.save_checkpoint()
            self.export(self.run_dir)
        finally:
            self.logger.close()
        return last

    def export(self, directory: Path) -> None:
        """The trained policy as a Hugging Face directory (LoRA merged), the critic in `critic/`."""
        policy = self.roles.policy
        if hasattr(policy, "merge_and_unload"):  # PEFT: write full weights, keep training state intact
            import copy

            policy = copy.deepcopy(policy).merge_and_unload()
        with quiet_hf_saves():
            policy.save_pretrained(directory)
            self.roles.tokenizer.save_pretrained(directory)
            if not self.shared_critic:
                self.roles.critic.save_pretrained(directory / "critic")

    def step(self) -> dict:
        """One iteration: rollout, experience, update, metrics."""
        c = self.config
        started = time.perf_counter()
        experience, metrics = self.make_experience()
        self.buffer = (self.buffer + [experience])[-c.train.buffer_size :]  # experience buffer (sec. 5.3.2)
        t0 = time.perf_counter()
        metrics.update(self.update(concat_experiences(self.buffer), train_policy=True))
        metrics["time/update"] = time.perf_counter() - t0
        metrics["time/iteration"] = time.perf_counter() - started
        metrics["throughput/tokens_per_s"] = experience.num_tokens / metrics["time/iteration"]
        # adaptive KL: e = clip(KL/target - 1, +-0.2); beta *= 1 + e * n / horizon (ALGORITHMS.md sec. 2)
        self.kl_controller.update(metrics["kl/ref"], experience.batch_size)
        if self.evaluator and c.log.eval_every and (self.iteration % c.log.eval_every == 0):
            metrics.update({f"eval/{k}": v for k, v in self.evaluator(self, self.iteration).items()})
        warnings = self.detector.update(self.iteration, metrics)
        metrics["collapse"] = bool(warnings) or bool(self.detector.fired)
        for message in warnings:
            self.logger.warn(message, step=self.iteration)
        if self.iteration % c.log.every == 0 or self.iteration == c.train.iterations - 1:
            self.logger.log(self.iteration, metrics)
        if warnings and c.log.stop_on_collapse:
            self.logger.warn(
                "stopping: log.stop_on_collapse is set and the collapse detector fired", step=self.iteration
            )
            metrics["stop"] = True
        return metrics

    def pretrain_step(self) -> None:
        """One critic pre-training iteration; stops early when the value loss plateaus."""
        c, state = self.config, self.pretrain_state
        experience, metrics = self.make_experience()
        stats = self.update(experience, train_policy=False)
        loss = stats["value/loss"]
        state["iterations"] += 1
        improved = state["iterations"] == 1 or loss < state["best"] * (1 - c.critic.pretrain_min_delta)
        if improved:  # the first iteration sets the baseline (inf * 0 would be NaN for min_delta 1)
            state["best"], state["stale"] = loss, 0
        else:
            state["stale"] += 1
        self.logger.log(
            state["iterations"] - 1,
            {
                "critic_pretrain/value_loss": loss,
                "critic_pretrain/explained_var": stats["value/explained_variance"],
            },
            kind="pretrain",
        )
        if (
            state["iterations"] >= c.critic.pretrain_iterations
            or state["stale"] >= c.critic.pretrain_patience
        ):
            self.pretrain_done = True

    # ----------------------------------------------------------------------------------------
    # rollout -> experience
    # ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def make_experience(self) -> tuple[Experience, dict]:
        c, r = self.config, self.roles
        tok = r.tokenizer
        t0 = time.perf_counter()
        prompt_ids, prompt_mask = left_pad(self.prompts.next_batch(c.rollout.batch_size), tok.pad_token_id)
        rollout = generate(
            r.policy,
            prompt_ids,
            prompt_mask,
            self.sampling,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            generator=self.sample_generator,
            return_logprobs=c.rollout.logprobs_from_sampler,
        )
        t1 = time.perf_counter()
        ids, attn, P = rollout.input_ids, rollout.attention_mask, rollout.prompt_length
        mask = rollout.response_mask.float()
        T = mask.shape[1]
        rows = c.train.micro_batch_size
        split = self.split_forward_threads(ids.numel())

        def over_rows(compute: Callable[[slice], torch.Tensor]) -> torch.Tensor:
            return by_row_halves(compute, len(ids), split)

        def per_token(fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]):
            return lambda w: forward_in_chunks(fn, ids[w], attn[w], P, T, rows)

        def scores_of(w: slice) -> torch.Tensor:
            i, a = ids[w], attn[w]
            return torch.cat(
                [r.reward_model.score(i[k : k + rows], a[k : k + rows]) for k in range(0, len(i), rows)]
            )

        raw_scores = over_rows(scores_of).float()
        # responses that hit max_new_tokens: keep, penalize or drop (PEERS.md point 8)
        scores, keep = apply_truncation_policy(
            raw_scores,
            rollout.ended_with_eos,
            policy=c.rollout.truncated,
            penalty=c.rollout.truncation_penalty,
        )
        if not bool(keep.all()):
            mask = mask * keep[:, None].float()
        t2 = time.perf_counter()
        temperature = c.rollout.temperature

        def policy_fn(i, a, p):
            return response_logprobs(r.policy, i, a, p, temperature=temperature)[0]

        if rollout.logprobs is not None:  # rollout.logprobs_from_sampler: no policy forward
            old_logp = rollout.logprobs * mask
        else:
            old_logp = over_rows(per_token(policy_fn))
        with r.reference.session() as reference_logprobs:  # a LoRA adapter is switched off once
            ref_logp = over_rows(per_token(lambda i, a, p: reference_logprobs(i, a, p, temperature)))
        values = over_rows(per_token(lambda i, a, p: response_values(r.critic, i, a, p)))
        t3 = time.perf_counter()

        # score reparameterization (sec. 5.3.1): running moments updated with this batch first
        processed = self.score_processor(scores[keep]) if bool(keep.any()) else scores[keep]
        processed_full = torch.zeros_like(scores)
        processed_full[keep] = processed
        # token-level KL penalty in the reward (sec. 5.3.2): -beta * kl on every token, score at EOS
        kl = kl_estimate(old_logp, ref_logp, kind=c.kl.estimator, mask=mask)
        rewards = token_rewards(processed_full, kl, mask, self.kl_controller.value)
        # GAE (sec. 2.2): V after the last valid token is 0; advantages/returns 0 at padding
        advantages, returns = gae(rewards, values, mask, c.advantage.gamma, c.advantage.lam)
        experience = Experience(
            input_ids=ids,
            attention_mask=attn,
            prompt_length=P,
            response_mask=mask,
            old_logp=old_logp,
            ref_logp=ref_logp,
            old_values=values,
            advantages=advantages,
            returns=returns,
        )
        lengths = rollout.response_mask.sum(1).float()
        k3 = kl_estimate(old_logp, ref_logp, kind="k3", mask=mask)
        per_sample_kl = masked_sum(kl, mask, dim=-1)
        kept = keep.float()
        metrics = {
            "reward/raw_mean": float(raw_scores.mean()),
            "reward/raw_std": float(raw_scores.std()) if len(raw_scores) > 1 else 0.0,
            "reward/processed_mean": float(processed.mean()) if len(processed) else 0.0,
            "reward/processed_std": float(processed.std()) if len(processed) > 1 else 0.0,
            "reward/raw_scores": [round(float(s), 4) for s in raw_scores],
            f"kl/{c.kl.estimator}": float((per_sample_kl * kept).sum() / kept.sum().clamp(min=1)),
            "kl/ref": float((per_sample_kl * kept).sum() / kept.sum().clamp(min=1)),
            "kl/k3": float((masked_sum(k3, mask, dim=-1) * kept).sum() / kept.sum().clamp(min=1)),
            "kl/beta": float(self.kl_controller.value),
            "policy_ppl": math.exp(-float(masked_mean(old_logp, mask))),
            "ref_ppl": math.exp(-float(masked_mean(ref_logp, mask))),
            "response/length_mean": float(lengths.mean()),
            "response/length_max": float(lengths.max()),
            "response/eos_rate": float(rollout.ended_with_eos.float().mean()),
            "response/distinct2": distinct_n(rollout.response_ids, rollout.response_mask, n=2),
            "advantage/mean": float(masked_mean(advantages, mask)),
            "advantage/std": float(masked_var(advantages, mask, unbiased=False).sqrt()),
            "return/mean": float(masked_mean(returns, mask)),
            "value/mean": float(masked_mean(values, mask)),
            "time/generate": t1 - t0,
            "time/score": t2 - t1,
            "time/forward": t3 - t2,
        }
        return experience, metrics

    # ----------------------------------------------------------------------------------------
    # update
    # ----------------------------------------------------------------------------------------
    def update(self, experience: Experience, *, train_policy: bool) -> dict:
        """`ppo_epochs` passes of shuffled minibatches; token-weighted micro-batch accumulation.

        Policy and separate critic take their optimizer steps on the same minibatches; they share no
        parameter, so with `train.overlap_critic` on a multi-core CPU the critic's steps run on a
        second thread beside the policy's (concurrency.py). The result is the same as in turn, to
        float rounding."""
        c = self.config
        minibatches = []
        for _ in range(c.train.ppo_epochs):
            for minibatch in experience.minibatches(c.train.minibatches, self.shuffle_generator):
                # advantage normalization and clipping, per minibatch (sec. 5.3.1)
                if c.advantage.whiten:
                    minibatch.advantages = whiten_advantages(
                        minibatch.advantages, minibatch.response_mask, clip=c.advantage.clip
                    )
                elif c.advantage.clip is not None:
                    minibatch.advantages = minibatch.advantages.clamp(-c.advantage.clip, c.advantage.clip)
                minibatches.append(minibatch)
        self.roles.policy.train(False)  # dropout stays off: ratios are exact
        policy_stats, critic_stats = UpdateStats(), UpdateStats()
        if self.shared_critic:  # one model, one optimizer: policy and value loss in one step
            for minibatch in minibatches:
                self.shared_minibatch_step(minibatch, policy_stats, train_policy=train_policy)
        elif not train_policy:  # critic pre-training
            for minibatch in minibatches:
                self.critic_minibatch_step(minibatch, critic_stats)
        else:
            policy_steps = [partial(self.policy_minibatch_step, m, policy_stats) for m in minibatches]
            critic_steps = [partial(self.critic_minibatch_step, m, critic_stats) for m in minibatches]
            threads = self.overlap_threads()
            if threads is None:
                for step in policy_steps + critic_steps:
                    step()
            else:  # the costlier side runs here and takes every core once the other is done
                policy_flops, critic_flops = self.step_flops(experience)
                policy, critic = (policy_steps, policy_flops), (critic_steps, critic_flops)
                (here, here_flops), (beside, beside_flops) = (
                    (policy, critic) if policy_flops >= critic_flops else (critic, policy)
                )
                handover = handover_step(len(here), here_flops, len(beside), beside_flops)
                run_side_by_side(here, beside, threads, handover)
        stats = {**policy_stats.result(), **critic_stats.result()}
        stats["policy/lr"] = self.policy_sched.get_last_lr()[0]
        if not self.shared_critic:
            stats["value/lr"] = self.critic_sched.get_last_lr()[0]
        return stats

    def overlap_threads(self) -> int | None:
        """Intra-op threads per side when the critic's update runs beside the policy's, else None:
        `train.overlap_critic` off, a model off the CPU, or a single core."""
        if not self.config.train.overlap_critic or not on_cpu(self.roles.policy, self.roles.critic):
            return None
        return side_by_side_threads()

    def split_forward_threads(self, tokens: int) -> int | None:
        """Intra-op threads per half of the rollout's rows in its no-grad forwards, else None:
        `rollout.split_forwards` off, a model off the CPU or changing its own state as it runs
        (dynamic RoPE), a single core, or a forward too small to gain from it (under
        MIN_SPLIT_FORWARD_FLOPS per half)."""
        r = self.roles
        if not self.config.rollout.split_forwards or not on_cpu(r.policy, r.critic, r.reward_model):
            return None
        if any(forward_changes_state(m) for m in (r.policy, r.critic.causal_lm, r.reward_model.causal_lm)):
            return None  # dynamic RoPE: one thread per model at a time
        if forward_flops([causal_lm_parts(r.policy)[0]], tokens / 2) < MIN_SPLIT_FORWARD_FLOPS:
            return None
        return side_by_side_threads()

    def step_flops(self, experience: Experience) -> tuple[float, float]:
        """Estimated FLOPs of one policy and one critic optimizer step on this experience (its
        tokens split over `train.minibatches`): the policy's output head sees only the response
        columns; the critic's scalar head (hidden -> 1, negligible) is counted on every column."""
        policy_decoder, policy_head = causal_lm_parts(self.roles.policy)
        critic_decoder, _ = causal_lm_parts(self.roles.critic.causal_lm)
        rows, width = experience.input_ids.shape
        response_share = experience.response_mask.shape[1] / max(1, width - 1)
        tokens = rows * (width - 1) / self.config.train.minibatches  # the last column is never computed
        policy = training_flops_per_token([policy_decoder, policy_head], scale=[1.0, response_share])
        critic = training_flops_per_token([critic_decoder, self.roles.critic.head])
        return policy * tokens, critic * tokens

    def policy_micro_loss(self, micro: Experience, stats: UpdateStats, weight: float) -> torch.Tensor:
        """This micro-batch's policy loss (policy loss - entropy bonus), its stats recorded."""
        c, p = self.config, self.config.policy
        logp, entropy = response_logprobs(
            self.roles.policy,
            micro.input_ids,
            micro.attention_mask,
            micro.prompt_length,
            temperature=c.rollout.temperature,
            with_entropy=True,
            entropy_grad=p.entropy_coef > 0,  # otherwise a monitor: no graph
        )
        pg_loss, pg_stats = policy_loss(
            p.loss,
            logp,
            micro.old_logp,
            micro.ref_logp,
            micro.advantages,
            micro.response_mask,
            **self.loss_params(),
        )
        mean_entropy = masked_mean(entropy, micro.response_mask)
        stats.add({**pg_stats, "loss": pg_loss.detach(), "entropy": mean_entropy.detach()}, weight, "policy")
        return pg_loss - p.entropy_coef * mean_entropy  # entropy bonus (sec. 5.3.2)

    def value_micro_loss(self, micro: Experience, stats: UpdateStats, weight: float) -> torch.Tensor:
        """This micro-batch's clipped value loss (ALGORITHMS.md sec. 7), its stats recorded."""
        values = response_values(
            self.roles.critic, micro.input_ids, micro.attention_mask, micro.prompt_length
        )
        vf_loss, vf_stats = value_loss(
            values,
            micro.old_values,
            micro.returns,
            micro.response_mask,
            clip_eps=self.config.critic.value_clip,
        )
        stats.add({**vf_stats, "loss": vf_loss.detach()}, weight, "value")
        return vf_loss

    def micro_batches(self, minibatch: Experience):
        """(micro-batch, weight) pairs; weight = its share of the minibatch's tokens (token mean)."""
        total_tokens = max(minibatch.num_tokens, 1.0)
        for micro in minibatch.micro_batches(self.config.train.micro_batch_size):
            weight = micro.num_tokens / total_tokens
            if weight > 0:
                yield micro, weight

    def ptx_backward(self, stats: UpdateStats) -> None:
        """PPO-ptx (InstructGPT): the SFT objective beside the RL loss reduces the alignment tax."""
        p = self.config.policy
        if self.ptx_batches is None or p.ptx_coef <= 0:
            return
        batch = self.ptx_batches(self.ptx_generator)
        nll, count = model_token_nll(
            self.roles.policy, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
        )
        ptx_loss = nll / max(count, 1)
        (p.ptx_coef * ptx_loss).backward()
        stats.add({"loss": ptx_loss.detach()}, 1.0, "ptx")

    def policy_minibatch_step(self, minibatch: Experience, stats: UpdateStats) -> None:
        """One optimizer step of the policy (separate critic)."""
        for micro, weight in self.micro_batches(minibatch):
            (weight * self.policy_micro_loss(micro, stats, weight)).backward()
        self.ptx_backward(stats)
        # global gradient clipping, separately for policy and critic (sec. 5.3.3)
        params = [q for g in self.policy_opt.param_groups for q in g["params"]]
        norm = clip_and_step(
            self.policy_opt, self.policy_sched, params, self.config.policy_optim.max_grad_norm
        )
        stats.add_grad_norm("policy/grad_norm", norm)

    def critic_minibatch_step(self, minibatch: Experience, stats: UpdateStats) -> None:
        """One optimizer step of the separate critic."""
        for micro, weight in self.micro_batches(minibatch):
            (weight * self.value_micro_loss(micro, stats, weight)).backward()
        params = [q for g in self.critic_opt.param_groups for q in g["params"]]
        norm = clip_and_step(
            self.critic_opt, self.critic_sched, params, self.config.critic_optim.max_grad_norm
        )
        stats.add_grad_norm("value/grad_norm", norm)

    def shared_minibatch_step(self, minibatch: Experience, stats: UpdateStats, *, train_policy: bool) -> None:
        """One step of the shared policy/critic model: value_coef-weighted value loss beside the policy
        loss; in critic pre-training (train_policy False) only the value head learns."""
        c = self.config
        for micro, weight in self.micro_batches(minibatch):
            if train_policy:
                # backward per loss: the policy graph is freed before the value forward
                (weight * self.policy_micro_loss(micro, stats, weight)).backward()
            (weight * c.model.value_coef * self.value_micro_loss(micro, stats, weight)).backward()
        if train_policy:
            self.ptx_backward(stats)
        params = [q for g in self.policy_opt.param_groups for q in g["params"]]
        if not train_policy:  # the policy trunk stays: only the value head's gradients are kept
            head = {id(q) for q in self.roles.critic.head.parameters()}
            for q in params:
                q.grad = q.grad if id(q) in head else None
        norm = clip_and_step(self.policy_opt, self.policy_sched, params, c.policy_optim.max_grad_norm)
        stats.add_grad_norm("policy/grad_norm" if train_policy else "value/grad_norm", norm)

    def loss_params(self) -> dict:
        p = self.config.policy
        if p.loss == "ppo":
            return {"clip_eps": p.clip_eps, "dual_clip": p.dual_clip, "ratio_against": p.ratio_against}
        if p.loss == "apa":
            return {"lam": p.apa_lam}
        if p.loss == "awr":
            return {"lam": p.awr_lam, "max_weight": p.awr_max_weight}
        return {}

    # ----------------------------------------------------------------------------------------
    # checkpoints
    # ----------------------------------------------------------------------------------------
    def state(self) -> dict:
        state = {
            "iteration": self.iteration,
            "pretrain_done": self.pretrain_done,
            "pretrain_state": {k: (v if math.isfinite(v) else None) for k, v in self.pretrain_state.items()},
            "policy_opt": self.policy_opt.state_dict(),
            "policy_sched": self.policy_sched.state_dict(),
            "score_processor": self.score_processor.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "prompts": self.prompts.state_dict(),
            "detector": self.detector.state_dict(),
            "rng": ckpt.rng_state(
                {
                    "sample": self.sample_generator,
                    "shuffle": self.shuffle_generator,
                    "ptx": self.ptx_generator,
                }
            ),
            "buffer": [asdict(e) for e in self.buffer],
        }
        if not self.shared_critic:
            state["critic_opt"] = self.critic_opt.state_dict()
            state["critic_sched"] = self.critic_sched.state_dict()
        return state

    def save_checkpoint(self) -> Path:
        from safetensors.torch import save_model

        target = self.run_dir / "checkpoints" / f"iter_{self.iteration:06d}"
        with ckpt.atomic_directory(target) as tmp:
            save_model(self.roles.policy, str(tmp / "policy.safetensors"))
            save_model(self.roles.critic, str(tmp / "critic.safetensors"))
            ckpt.save_state(self.state(), tmp, "trainer")
            (tmp / "DONE").write_text(str(self.iteration))
        ckpt.prune_checkpoints(self.run_dir, self.config.checkpoint.keep)
        return target

    def load_checkpoint(self, path: Path) -> None:
        from safetensors.torch import load_model

        load_model(self.roles.policy, str(path / "policy.safetensors"))
        load_model(self.roles.critic, str(path / "critic.safetensors"))
        state = ckpt.load_state(path, "trainer")
        self.iteration = state["iteration"]
        self.pretrain_done = state["pretrain_done"]
        self.pretrain_state = {k: (math.inf if v is None else v) for k, v in state["pretrain_state"].items()}
        self.policy_opt.load_state_dict(state["policy_opt"])
        self.policy_sched.load_state_dict(state["policy_sched"])
        if not self.shared_critic:
            self.critic_opt.load_state_dict(state["critic_opt"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        self.score_processor.load_state_dict(state["score_processor"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.prompts.load_state_dict(state["prompts"])
        self.detector.load_state_dict(state["detector"])
        ckpt.set_rng_state(
            state["rng"],
            {"sample": self.sample_generator, "shuffle": self.shuffle_generator, "ptx": self.ptx_generator},
        )
        self.buffer = [Experience(**e) for e in state["buffer"]]
