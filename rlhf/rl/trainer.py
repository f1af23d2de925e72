"""The RL loop: PPO, PPO-max, APA, AWR and the critic-free estimators in one trainer. One iteration
(docs/internals.md#data-flow-of-one-rl-iteration):

    rollout   a batch sampled and scored by the rollout source            policy, reward model
    forward   old log-probs, reference log-probs, values                  policy, reference, critic
    advantage processed scores -> token rewards with KL -> GAE (or a critic-free estimator)
    update    epochs x minibatches of policy loss + value loss (+ entropy, + ptx)

It talks to the roles (rlhf/rl/roles/) through a runtime; every trick of the PPO paper is a named line
switched by its own config field, those of the update in the policy's step (rlhf/rl/roles/policy.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rlhf.config import ConfigError, RLConfig
from rlhf.core import (
    AdaptiveKLController,
    FixedKLController,
    ScoreProcessor,
    decoupled_is_weights,
    estimate_advantages,
    estimator_params,
    estimator_spec,
    kl_estimate,
    masked_whiten,
    token_rewards,
)
from rlhf.data.collate import PtxBatches
from rlhf.envs import place_turn_rewards
from rlhf.models.sampling import Rollout
from rlhf.rl.critic_pretrain import PretrainState
from rlhf.rl.experience import Experience, concat_experiences
from rlhf.rl.metrics import experience_metrics, mean_over_steps
from rlhf.rl.monitors import Metrics, RunMonitors, open_run_logger
from rlhf.rl.rollout_correction import corrected_weights
from rlhf.rl.run_guards import RunGuards
from rlhf.rl.scorer import RawScoresHook, Scorer
from rlhf.rl.sources import rollout_source
from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.run_inputs import write_config
from rlhf.rundir.termination import finish_first
from rlhf.runtime.protocol import Runtime

Evaluator = Callable[["RLTrainer", int], dict[str, float]]


class RLTrainer:
    """One RL run: the runtime that serves the roles (rlhf/runtime/protocol.py: the trainer reaches
    them through it alone), the collaborators it is given, and the loop's own state (score
    statistics, KL coefficient, experience buffer, critic pre-training). `raw_scores_hook`: the raw
    scores RL sees instead of the scorer's (rlhf/rl/scorer.py; the demo's worlds distort them)."""

    def __init__(self, config: RLConfig, runtime: Runtime, prompts: list[list[int]], *,
                 ptx_batches: PtxBatches | None = None, evaluator: Evaluator | None = None,
                 run_dir: str | Path | None = None, resume: bool = False, quiet: bool = False,
                 prompt_rows: list[dict[str, Any]] | None = None,
                 raw_scores_hook: RawScoresHook | None = None) -> None:  # fmt: skip
        c = self.config = config
        self.runtime, self.evaluator, self.run_dir = runtime, evaluator, Path(run_dir or c.out)
        torch.manual_seed(c.seed)
        self.monitors = RunMonitors(c, runtime.tokenizer)
        self.scorer = Scorer(c, runtime, prompt_rows, raw_scores_hook, status=self.status)
        self.rollouts = rollout_source(c, runtime, prompts, self.scorer, self.monitors.mismatch, prompt_rows)
        self.guards = RunGuards(c, runtime.tokenizer)
        self.shuffle_generator = torch.Generator().manual_seed(c.seed + 2)
        self.whole_groups = estimator_spec(c.advantage.estimator).needs_group  # grpo: a group per minibatch
        self.ptx_note = use_ptx(runtime, ptx_batches, c)
        r = c.reward  # score reparameterization: scaling / normalization / clipping (PPO paper §5.3.1)
        self.score_processor = ScoreProcessor(scale=r.scale, normalize=r.normalize, clip=r.clip,
                                              discounted=r.discounted, gamma=r.discount_gamma)  # fmt: skip
        # token-level KL penalty with a fixed or adaptive coefficient (PPO paper §5.3.2; Ziegler et al. 2019)
        k = c.kl
        self.kl_controller = AdaptiveKLController(k.beta, k.target, k.horizon) if k.adaptive else FixedKLController(k.beta)  # fmt: skip
        self.buffer: list[Experience] = []
        # no critic: a preset's pre-training iterations are not run
        self.iteration, self.pretrain_done = 0, c.critic.pretrain_iterations == 0 or not c.uses_critic
        self.pretrain_state = PretrainState()
        notes = self.resume() if resume else []  # said once the logger is open
        self.logger = open_run_logger(c, self.run_dir, runtime.writer, self.iteration, resume, quiet)
        for note in notes:
            self.logger.warn(note, step=self.iteration)

    # ----------------------------------------------------------------------------------------
    # the loop
    # ----------------------------------------------------------------------------------------
    def train(self) -> Metrics:
        c = self.config
        if self.runtime.writer:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_config(c, self.run_dir)  # only when it changes; its sha256 recorded (run_inputs.json)
        if self.ptx_note and self.iteration == 0:
            self.logger.warn(self.ptx_note, step=0)
        last: Metrics = {}
        try:
            # critic pre-training: value loss only, policy frozen (PPO paper §5.3.3)
            while not self.pretrain_done:
                self.pretrain_step()
            while self.iteration < c.train.iterations:
                last = self.step()
                self.iteration += 1
                if last.get("stop"):
                    break
                if c.checkpoint.every and self.iteration % c.checkpoint.every == 0:
                    with finish_first():  # a SIGTERM now lets the due checkpoint be written first
                        self.save_checkpoint()
            with finish_first():
                self.save_checkpoint()
                self.runtime.export(
                    self.run_dir
                )  # fsdp2: every rank gathers each model in turn, rank 0 writes
        finally:
            self.logger.close()
        return last

    def step(self) -> Metrics:
        """One iteration: rollout, experience, update, metrics."""
        c = self.config
        started = time.perf_counter()
        experience, metrics = self.make_experience()
        # experience buffer (PPO paper §5.3.2)
        self.buffer = (self.buffer + [experience])[-c.train.buffer_size :]
        self.rollouts.sample_ahead(self.iteration)  # asynchronous: sampled during the update (§34)
        self.status("updating")
        t0 = time.perf_counter()
        metrics.update(self.update(concat_experiences(self.buffer)))
        metrics["time/update"] = time.perf_counter() - t0
        metrics["time/iteration"] = time.perf_counter() - started
        metrics["throughput/tokens_per_s"] = experience.num_tokens / metrics["time/iteration"]
        # adaptive KL (Ziegler et al.): e = clip(KL/target - 1, +-0.2); beta *= 1 + e * n / horizon
        self.kl_controller.update(metrics["kl/ref"], experience.batch_size)
        if self.evaluator and c.log.eval_every and (self.iteration % c.log.eval_every == 0):
            self.status("evaluating")
            metrics.update({f"eval/{k}": v for k, v in self.evaluator(self, self.iteration).items()})
        collapsed = self.monitors.observe(self.iteration, metrics, self.logger)  # collapse (PPO paper §5.2)
        if self.iteration % c.log.every == 0 or self.iteration == c.train.iterations - 1:
            self.logger.log(self.iteration, metrics)
            self.monitors.samples.write(self.logger, self.iteration)
        if collapsed and c.log.stop_on_collapse:
            self.logger.warn(
                "stopping: log.stop_on_collapse is set and the collapse detector fired", step=self.iteration
            )
            metrics["stop"] = True
        return metrics

    def status(self, what: str) -> None:
        """Show the part of the step under way (a sign of life in a long step; console only)."""
        if self.pretrain_done:
            self.logger.status(what, self.iteration, "iteration")
        else:
            self.logger.status(what, self.pretrain_state.iterations, "pretrain")

    def pretrain_step(self) -> None:
        """One critic pre-training iteration; stops early when the value loss plateaus."""
        experience, _ = self.make_experience()
        self.status("updating the critic")
        stats = self.update(experience, train_policy=False)
        loss = float(stats["value/loss"])
        self.pretrain_done = self.pretrain_state.record(loss, self.config)
        pretrain = {
            "critic_pretrain/value_loss": loss,
            "critic_pretrain/explained_var": stats["value/explained_variance"],
        }
        self.logger.log(self.pretrain_state.iterations - 1, pretrain, kind="pretrain")

    @torch.inference_mode()
    def make_experience(self) -> tuple[Experience, Metrics]:
        """Sample and score, run the no-grad forwards, and turn scores into advantages."""
        c = self.config
        self.status("sampling")
        scored = self.rollouts.next_batch(self.iteration)  # sampled and scored (rlhf/rl/rollout_source.py)
        rollout, scores, keep = scored.rollout, scored.scores, scored.keep
        self.monitors.samples.keep(rollout, scored.raw_scores)
        mask = rollout.response_mask.float() * keep[:, None].float()  # dropped responses train nothing
        t0 = time.perf_counter()
        self.status("forwards")
        old_logp, ref_logp, values = self.forwards(rollout, mask)
        outputs = {"policy": old_logp, "reference": ref_logp, "critic": values}
        self.guards.require_finite_forwards(rollout, mask, outputs, self.when())  # NaN/inf stops the run
        is_weights = torch.ones_like(mask)  # each token's surrogate weight: 1 when synchronous
        async_metrics: dict[str, float] = {}
        if self.asynchronous:  # decoupled PPO: the sampler's policy was `behind` updates old (§34)
            assert rollout.logprobs is not None  # submitted with them (AsyncRollouts.submit)
            behaviour, truncation = rollout.logprobs, c.policy.is_truncation
            is_weights, async_metrics = decoupled_is_weights(old_logp, behaviour, mask, truncation)
            async_metrics["async/staleness"] = scored.behind
        is_weights, correction_metrics = corrected_weights(  # sampler -> trainer (§44)
            c.rollout.correction, is_weights, old_logp, rollout.logprobs, mask, self.asynchronous)  # fmt: skip
        t1 = time.perf_counter()
        # score reparameterization (PPO paper §5.3.1): running moments updated with this batch first
        processed = self.score_processor(scores[keep]) if bool(keep.any()) else scores[keep]
        # token-level KL penalty in the reward (PPO paper §5.3.2): -beta * kl on every token, score at EOS
        kl = kl_estimate(old_logp, ref_logp, kind=c.kl.estimator, mask=mask)
        final_scores = torch.zeros_like(scores).index_put_((keep,), processed)  # dropped rows: 0
        rewards = token_rewards(final_scores, kl, mask, self.kl_controller.value)
        placement = c.agent.reward_placement if c.agent.name else c.env.reward_placement
        if scored.turn_rewards is not None and placement == "turn":  # each turn's at its end
            rewards = place_turn_rewards(rewards, scored.turn_rewards, mask)
        # GAE over the critic's values (PPO paper §3.2.2), or critic-free (docs/algorithms.md §27-30)
        a, group = c.advantage, scored.group.to(mask.device)
        advantages, returns = estimate_advantages(
            a.estimator, rewards, mask, values=values, group=group, **estimator_params(a.estimator, a)
        )
        old_values = values if values is not None else torch.zeros_like(mask)
        experience = Experience.of(rollout.sequences, mask, old_logp=old_logp, ref_logp=ref_logp,
                                   old_values=old_values, advantages=advantages, returns=returns, group=group,
                                   is_weights=is_weights)  # fmt: skip
        metrics = experience_metrics(c, scored, experience, processed, kl, final_scores,
                                     self.kl_controller.value, self.runtime.has_role("critic"))  # fmt: skip
        metrics.update(async_metrics | correction_metrics)
        if self.pretrain_done:  # mismatch/*: the sampler's log-probs against the trainer's (docs/monitors.md)
            metrics.update(
                self.monitors.mismatch_metrics(
                    self.iteration, scored, mask, old_logp, self.runtime, self.logger
                )
            )
        metrics["time/forward"] = t1 - t0
        return experience, metrics

    def forwards(
        self, rollout: Rollout, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The no-grad forwards: old log-probs (the sampler's when it kept them), reference
        log-probs, and the critic's values (None for a critic-free estimator)."""
        run, sequences = self.runtime, rollout.sequences
        if self.config.rollout.logprobs_from_sampler and not self.asynchronous:  # no forward
            assert rollout.logprobs is not None  # the sampler keeps them under logprobs_from_sampler
            old_logp = rollout.logprobs * mask
        else:
            old_logp = run.forward("policy", sequences)
        ref_logp = run.forward("reference", sequences)
        values = run.forward("critic", sequences) if run.has_role("critic") else None
        return old_logp, ref_logp, values

    def update(self, experience: Experience, *, train_policy: bool = True) -> Metrics:
        """`ppo_epochs` passes of shuffled minibatches, one optimizer step of each learner per minibatch."""
        c = self.config
        minibatches = []
        for _ in range(c.train.ppo_epochs):
            for minibatch in experience.minibatches(
                c.train.minibatches, self.shuffle_generator, whole_groups=self.whole_groups
            ):
                # advantage normalization and clipping, per minibatch (PPO paper §5.3.1)
                minibatch.advantages = minibatch_advantages(
                    minibatch.advantages, minibatch.response_mask, c.advantage.whiten, c.advantage.clip
                )
                if (self.asynchronous or c.rollout.correction.enabled) and minibatch.is_weights is not None:
                    # decoupled PPO and rollout correction: each token's surrogate weighted (§34, §44;
                    # None never: Experience sets 1s when not given)
                    minibatch.advantages = minibatch.advantages * minibatch.is_weights
                minibatches.append(minibatch)
        stats = mean_over_steps(self.runtime.train(self.runtime.learner_names(train_policy), minibatches))
        self.guards.check_skipped_steps(stats, self.iteration, self.logger.warn)  # NaN/inf gradients
        return {**stats, **self.runtime.learning_rates()}

    @property
    def asynchronous(self) -> bool:
        """rollout.max_staleness > 0: rollouts sampled ahead by the rollout actors (AsyncRollouts, §34)."""
        return self.config.rollout.max_staleness > 0

    def when(self) -> str:
        """The iteration under way, in words (for the guards' messages)."""
        if self.pretrain_done:
            return f"iteration {self.iteration}"
        return f"critic pre-training iteration {self.pretrain_state.iterations}"

    # ----------------------------------------------------------------------------------------
    # state: checkpoints, resume, the run's log
    # ----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "pretrain_done": self.pretrain_done,
            "pretrain_state": self.pretrain_state.state_dict(),
            "score_processor": self.score_processor.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "detector": self.monitors.detector.state_dict(),
            "rng": ckpt.rng_state({"shuffle": self.shuffle_generator}),
            "buffer": [asdict(e) for e in self.buffer],
            **self.rollouts.state(),  # "prompts", "pending"
        }

    def save_checkpoint(self) -> Path:
        """The checkpoint of this iteration: the loop's `state`, the roles' weights and state (the
        runtime's: whole files, or each rank's shards under fsdp2); the oldest past `keep` pruned."""
        target = self.run_dir / "checkpoints" / f"iter_{self.iteration:06d}"
        self.runtime.save_checkpoint(target, self.state(), self.iteration)
        if self.runtime.writer:
            ckpt.prune_checkpoints(self.run_dir, self.config.checkpoint.keep)
        return target

    def load_checkpoint(self, path: Path) -> None:
        state = self.runtime.load_checkpoint(path)  # the roles' weights and state loaded
        self.iteration = state["iteration"]
        self.pretrain_done = state["pretrain_done"]
        self.pretrain_state = PretrainState.of(state["pretrain_state"])
        self.score_processor.load_state_dict(state["score_processor"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.monitors.detector.load_state_dict(state["detector"])
        ckpt.set_rng_state(state["rng"], {"shuffle": self.shuffle_generator})
        self.buffer = [Experience(**e).to(self.runtime.device) for e in state["buffer"]]
        self.rollouts.load_state(state)

    def resume(self) -> list[str]:
        """Load the newest complete checkpoint (damaged newer ones skipped); the notes to log."""
        notes: list[str] = []
        if self.runtime.writer:
            ckpt.clean_stale(self.run_dir)  # what killed checkpoint writes left behind
        found = ckpt.latest_verified(self.run_dir, warn=notes.append)
        if found is None:
            raise ConfigError(
                f"{self.run_dir} has no complete checkpoint to resume from (checkpoints/iter_*/DONE). "
                "Fix: start a fresh run with another --out, or set checkpoint.every to save during a run."
            )
        self.load_checkpoint(found)
        return notes


def use_ptx(runtime: Runtime, ptx_batches: PtxBatches | None, config: RLConfig) -> str | None:
    """PPO-ptx (InstructGPT §3.5): the pretraining batches handed to the policy's learner when
    policy.ptx_coef > 0; the note to log when there are none to hand."""
    coef = config.policy.ptx_coef
    if ptx_batches is None or coef <= 0:
        return "PPO-ptx is off: policy.ptx_coef > 0 but no data.ptx was given." if coef > 0 else None
    runtime.use_ptx(ptx_batches, coef, seed=config.seed + 3)
    return None


def minibatch_advantages(
    advantages: torch.Tensor, mask: torch.Tensor, whiten: bool, clip: float | None
) -> torch.Tensor:
    """A minibatch's advantages normalized (`advantage.whiten`: masked whitening, mean 0 and unbiased
    variance 1 over its valid tokens) and then clipped to [-clip, clip] (`advantage.clip`), PPO paper
    §5.3.1 (docs/algorithms.md §11): over the whole minibatch, before any split into micro-batches.
    0 at masked positions; a fully masked minibatch gives zeros."""
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages if clip is None else advantages.clamp(-clip, clip)
