"""The RL loop: PPO, PPO-max, APA and AWR in one trainer.

One iteration (docs/internals.md#data-flow-of-one-rl-iteration):

    rollout   sample responses to a batch of prompts                 policy
    score     reward model at the last real token (+ reward functions) reward model
    forward   old log-probs, reference log-probs, values             policy, reference, critic
    advantage processed scores -> token rewards with KL -> GAE (or a critic-free estimator)
    update    epochs x minibatches of policy loss + value loss (+ entropy, + ptx)

The loop talks to the roles (rlhf/rl/roles/) and lets a runtime (rlhf/runtime/) schedule their
work; every trick of the PPO paper is a named line switched by its own config field: those of the
experience below, those of the update in the policy's step (rlhf/rl/roles/policy.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf.config import ConfigError, RLConfig
from rlhf.config.env import response_budget
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
from rlhf.envs import Episodes, load_environment, place_turn_rewards, run_episodes
from rlhf.models.sampling import Rollout
from rlhf.models.truncation import apply_truncation_policy
from rlhf.monitor import CollapseDetector
from rlhf.monitor.stillness import CODE as STILL_POLICY
from rlhf.monitor.stillness import StillPolicyCheck
from rlhf.rl.dapo import Scored, fill_with_informative, overlong_buffer_tokens, shaped_scores
from rlhf.rl.experience import Experience, concat_experiences
from rlhf.rl.groups import group_metrics, sample_groups
from rlhf.rl.metrics import rollout_metrics
from rlhf.rl.mismatch import CODE as MISMATCH
from rlhf.rl.mismatch import MismatchMonitor
from rlhf.rl.prompts import PromptStream
from rlhf.rl.remote_reward import remote_reward
from rlhf.rl.reward_functions import load_reward_functions, part_metrics, rollout_texts, weighted_reward
from rlhf.rl.roles.assemble import optimizer_steps
from rlhf.rl.sample_log import SampleLog
from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.directory import open_metrics_logger
from rlhf.rundir.run_inputs import write_config
from rlhf.rundir.termination import finish_first
from rlhf.runtime.protocol import Ready, RolloutHandle, Runtime
from rlhf.train.guards import (
    NONFINITE_GRADIENTS,
    NonFiniteScoresError,
    require_finite_scores,
    require_finite_tokens,
)

# on the console line; the KL is k3's, never negative (kl/ref, the configured estimator, may be: k1)
KEY_METRICS = ("reward/raw_mean", "kl/k3", "policy_ppl", "response/length_mean", "policy/clip_fraction")
Evaluator = Callable[["RLTrainer", int], dict[str, float]]
Metrics = dict[str, Any]  # an iteration's metrics: numbers, and lists or flags (`reward/raw_scores`, `stop`)


@dataclass
class PretrainState:
    """Critic pre-training's progress: iterations done, the best value loss, iterations since it improved."""

    iterations: int = 0
    best: float = math.inf
    stale: int = 0

    def state_dict(self) -> dict[str, float | None]:
        return {"iterations": self.iterations, "best": self.best if math.isfinite(self.best) else None,
                "stale": self.stale}  # fmt: skip

    @classmethod
    def of(cls, state: dict[str, Any]) -> PretrainState:
        best = state["best"]
        return cls(int(state["iterations"]), math.inf if best is None else float(best), int(state["stale"]))


@dataclass
class PendingRollout:
    """A rollout submitted to the runtime (asynchronous): its prompts' group ids and rows of the
    prompt file, the handle whose `result()` is the Rollout, the policy version that samples it."""

    group: torch.Tensor
    indices: list[int]
    handle: RolloutHandle
    version: int


class RLTrainer:
    """One RL run: the runtime that serves the roles (rlhf/runtime/protocol.py: the trainer reaches
    them through it alone), and the loop's own state (score statistics, KL coefficient, prompt
    stream, experience buffer, collapse detector)."""

    def __init__(
        self,
        config: RLConfig,
        runtime: Runtime,
        prompts: list[list[int]],
        *,
        ptx_batches: PtxBatches | None = None,
        evaluator: Evaluator | None = None,
        run_dir: str | Path | None = None,
        resume: bool = False,
        quiet: bool = False,
        prompt_rows: list[dict[str, Any]] | None = None,
    ) -> None:
        c = self.config = config
        self.runtime = runtime
        self.run_dir = Path(run_dir or c.out)
        self.evaluator = evaluator
        torch.manual_seed(c.seed)
        self.prompts = PromptStream(prompts, seed=c.seed)
        self.prompt_rows = prompt_rows  # the prompt file's records, for reward functions
        self.reward_functions = load_reward_functions(c.reward.functions)  # only those named
        self.reward_parts: dict[str, float] = {}
        self.remote_reward = remote_reward(c.reward.remote, self.runtime.tokenizer)  # None: no --reward-url
        self.mismatch = MismatchMonitor(c)  # sampler vs trainer log-probs of the same tokens
        # multi-turn episodes against `env.name` (docs/environments.md); `episodes`: the last batch's
        self.environment = load_environment(c.env.name) if c.env.name else None
        self.episodes: Episodes | None = None
        self.shuffle_generator = torch.Generator().manual_seed(c.seed + 2)
        # an estimator comparing the rows of one prompt (grpo, rloo, ...) keeps each group in one minibatch
        self.whole_groups = estimator_spec(c.advantage.estimator).needs_group
        if ptx_batches is not None and c.policy.ptx_coef > 0:
            self.runtime.use_ptx(ptx_batches, c.policy.ptx_coef, seed=c.seed + 3)
        self.ptx_note = (
            "PPO-ptx is off: policy.ptx_coef > 0 but no data.ptx was given."
            if ptx_batches is None and c.policy.ptx_coef > 0
            else None
        )
        # score reparameterization: scaling / normalization / clipping, each its own switch (PPO paper §5.3.1)
        r = c.reward
        self.score_processor = ScoreProcessor(
            scale=r.scale, normalize=r.normalize, clip=r.clip, discounted=r.discounted, gamma=r.discount_gamma
        )
        # token-level KL penalty with a fixed or adaptive coefficient (PPO paper §5.3.2; Ziegler et al. 2019)
        self.kl_controller = (
            AdaptiveKLController(c.kl.beta, c.kl.target, c.kl.horizon)
            if c.kl.adaptive
            else FixedKLController(c.kl.beta)
        )
        self.buffer: list[Experience] = []
        self.iteration = 0
        # rollout.max_staleness K > 0: the next K rollouts, sampled while the policy updates, in the
        # order they are trained on (PendingRollout)
        self.asynchronous = c.rollout.max_staleness > 0
        self.pending: list[PendingRollout] = []
        self.batch_indices: list[int] = []  # the prompt file's rows of the rollout being scored
        self.pretrain_done = c.critic.pretrain_iterations == 0
        self.pretrain_state = PretrainState()
        self.skipped_streak = SkippedStepStreak()
        self.detector = collapse_detector(c)
        # a policy that does not move (a learning rate far too small): said once, with the fix
        self.still_check = StillPolicyCheck.of(c, start=warmup_iterations(c))
        self.samples = SampleLog(c, self.runtime.tokenizer)  # samples.jsonl rows of the logged iterations
        notes: list[str] = []  # said once the logger is open
        if resume:
            if self.runtime.writer:
                ckpt.clean_stale(self.run_dir)  # what killed checkpoint writes left behind
            found = ckpt.latest_verified(self.run_dir, warn=notes.append)  # damaged newest ones skipped
            if found is None:
                raise ConfigError(
                    f"{self.run_dir} has no complete checkpoint to resume from (checkpoints/iter_*/DONE). "
                    "Fix: start a fresh run with another --out, or set checkpoint.every to save during a run."
                )
            self.load_checkpoint(found)
        self.logger = open_metrics_logger(
            self.run_dir,
            resumable=True,
            sinks=tuple(c.log.sinks) if not quiet else ("jsonl",),
            # each phase in its own units: `pretrain i/P`, then `iteration i/N`
            total={"pretrain": c.critic.pretrain_iterations, "iteration": c.train.iterations},
            indexed=True,  # `iteration` and `pretrain` are 0-based: record i is the (i+1)-th done
            key_metrics=KEY_METRICS,
            resume=resume,
            resume_step=self.iteration - 1 if resume else None,
            writer=self.runtime.writer,  # under torchrun, rank 0 alone writes
        )
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
        self.submit_ahead()  # sampled by the rollout actors during the update
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
        warnings = self.detector.update(self.iteration, metrics)  # the collapse signature (PPO paper §5.2)
        metrics["collapse"] = bool(warnings) or bool(self.detector.fired)
        for message in warnings:
            self.logger.warn(message, step=self.iteration)
        still = self.still_check.update(self.iteration, metrics)
        if still is not None:
            self.logger.warn(still, step=self.iteration, code=STILL_POLICY)
        if self.iteration % c.log.every == 0 or self.iteration == c.train.iterations - 1:
            self.logger.log(self.iteration, metrics)
            self.samples.write(self.logger, self.iteration)
        if warnings and c.log.stop_on_collapse:
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
        c, state = self.config, self.pretrain_state
        experience, _ = self.make_experience()
        self.status("updating the critic")
        stats = self.update(experience, train_policy=False)
        loss = float(stats["value/loss"])
        state.iterations += 1
        improved = state.iterations == 1 or loss < state.best * (1 - c.critic.pretrain_min_delta)
        if improved:  # the first iteration sets the baseline (inf * 0 would be NaN for min_delta 1)
            state.best, state.stale = loss, 0
        else:
            state.stale += 1
        self.logger.log(
            state.iterations - 1,
            {
                "critic_pretrain/value_loss": loss,
                "critic_pretrain/explained_var": stats["value/explained_variance"],
            },
            kind="pretrain",
        )
        if state.iterations >= c.critic.pretrain_iterations or state.stale >= c.critic.pretrain_patience:
            self.pretrain_done = True

    @torch.inference_mode()
    def make_experience(self) -> tuple[Experience, Metrics]:
        """Sample, score, run the no-grad forwards, and turn scores into advantages."""
        c = self.config
        t0 = time.perf_counter()
        self.status("sampling")
        group, rollout, behind = self.take_rollout()
        t1 = time.perf_counter()
        self.status("scoring")
        scored = Scored(group, rollout, *self.score(rollout), behind)
        sampling_metrics: dict[str, float] = {}
        if c.rollout.dynamic_sampling:  # groups of equal scores dropped and refilled (DAPO §3.2; §36)
            scored, sampling_metrics = fill_with_informative(
                scored, self.sample_scored, c.rollout.batch_size, c.rollout.max_sampling_rounds,
                self.runtime.tokenizer.pad_token_id or 0,
            )  # fmt: skip
        group, rollout, raw_scores, scores, keep = (scored.group, scored.rollout, scored.raw_scores,
                                                    scored.scores, scored.keep)  # fmt: skip
        self.samples.keep(rollout, raw_scores)
        mask = rollout.response_mask.float() * keep[:, None].float()  # dropped responses train nothing
        t2 = time.perf_counter()
        self.status("forwards")
        old_logp, ref_logp, values = self.forwards(rollout, mask)
        self.require_finite_forwards(rollout, mask, old_logp, ref_logp, values)
        is_weights = torch.ones_like(mask)  # each token's surrogate weight: 1 when synchronous
        async_metrics: dict[str, float] = {}
        if self.asynchronous:  # decoupled PPO: the sampler's policy was `behind` updates old (§34)
            assert rollout.logprobs is not None  # submitted with them (`submit_rollout`)
            is_weights, async_metrics = decoupled_is_weights(
                old_logp, rollout.logprobs, mask, self.config.policy.is_truncation
            )
            async_metrics["async/staleness"] = behind
        t3 = time.perf_counter()
        # score reparameterization (PPO paper §5.3.1): running moments updated with this batch first
        processed = self.score_processor(scores[keep]) if bool(keep.any()) else scores[keep]
        # token-level KL penalty in the reward (PPO paper §5.3.2): -beta * kl on every token, score at EOS
        kl = kl_estimate(old_logp, ref_logp, kind=c.kl.estimator, mask=mask)
        final_scores = torch.zeros_like(scores).index_put_((keep,), processed)  # dropped rows: 0
        rewards = token_rewards(final_scores, kl, mask, self.kl_controller.value)
        if self.episodes is not None and c.env.reward_placement == "turn":  # each turn's at its end
            rewards = place_turn_rewards(rewards, self.episodes.turn_rewards, mask)
        # GAE over the critic's values (PPO paper §3.2.2), or critic-free (docs/algorithms.md §27-30)
        a, group = c.advantage, group.to(mask.device)
        advantages, returns = estimate_advantages(
            a.estimator, rewards, mask, values=values, group=group, **estimator_params(a.estimator, a)
        )
        old_values = values if values is not None else torch.zeros_like(mask)
        experience = Experience.of(rollout.sequences, mask, old_logp=old_logp, ref_logp=ref_logp,
                                   old_values=old_values, advantages=advantages, returns=returns, group=group,
                                   is_weights=is_weights)  # fmt: skip
        metrics = self.experience_metrics(scored, experience, processed, kl, final_scores)
        metrics.update(async_metrics)
        metrics.update(self.mismatch_metrics(rollout, mask, old_logp, behind))
        metrics.update(sampling_metrics)
        metrics.update({"time/generate": t1 - t0, "time/score": t2 - t1, "time/forward": t3 - t2})
        return experience, metrics

    def draw_prompts(self) -> tuple[list[list[int]], torch.Tensor, list[int]]:
        """The next batch of prompts, each repeated samples_per_prompt times, its rows one group
        (docs/algorithms.md §27); (prompts, group ids, the prompt file's rows)."""
        c = self.config
        prompts, group = sample_groups(
            self.prompts.next_batch(c.rollout.batch_size), c.rollout.samples_per_prompt
        )
        return prompts, group, list(self.prompts.last_indices)

    def submit_ahead(self) -> None:
        """Asynchronous: up to rollout.max_staleness K rollouts sampled ahead (none past the last
        iteration). The one submitted during update u is sampled by the policy of version u (the
        rollout actors run their calls in order: the weights of every earlier update first) and
        trained on at iteration u + (its place in the queue) <= u + K: at most K versions behind (§34)."""
        if not self.asynchronous:
            return
        left = self.config.train.iterations - self.iteration - 1
        while len(self.pending) < min(self.config.rollout.max_staleness, left):
            self.pending.append(self.submit_rollout())

    def submit_rollout(self) -> PendingRollout:
        """The next rollout, sampled by the rollout actors while this process goes on (asynchronous)."""
        prompts, group, indices = self.draw_prompts()
        handle = self.runtime.submit_generate(prompts, True)  # the behaviour log-probs with it
        return PendingRollout(group, indices, handle, self.runtime.policy_version)

    def take_rollout(self) -> tuple[torch.Tensor, Rollout, int]:
        """(group ids, the rollout, updates its sampler's policy was behind): the oldest pending one
        (asynchronous), or sampled now by the current policy."""
        if not self.pending and self.asynchronous:
            self.pending.append(self.submit_rollout())
        if self.pending:
            pending = self.pending.pop(0)
            self.batch_indices = pending.indices
            return pending.group, pending.handle.result(), self.runtime.policy_version - pending.version
        prompts, group, self.batch_indices = self.draw_prompts()
        if self.environment is not None:  # multi-turn episodes: one batched generate per turn
            return group, self.run_episodes(prompts), 0
        from_sampler = self.config.rollout.logprobs_from_sampler or self.mismatch.due(self.iteration)
        return group, self.runtime.generate(prompts, from_sampler), 0

    def run_episodes(self, prompts: list[list[int]]) -> Rollout:
        """One episode of the environment per prompt row, to its end (rlhf/envs/rollout.py); the
        environment's rewards are kept for `score`."""
        c = self.config
        indices = [i for i in self.batch_indices for _ in range(c.rollout.samples_per_prompt)]
        assert self.environment is not None
        envs = [self.environment.episode(self.prompt_rows[i] if self.prompt_rows else {}, i) for i in indices]
        self.episodes = run_episodes(
            lambda contexts: self.runtime.generate(contexts, c.rollout.logprobs_from_sampler),
            self.runtime.tokenizer,
            prompts,
            envs,
            self.environment,
            max_turns=c.env.max_turns,
            max_tokens=response_budget(c.env, c.rollout.max_new_tokens),
            rows=indices,
            return_logprobs=c.rollout.logprobs_from_sampler,
        )
        return self.episodes.rollout

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

    def mismatch_metrics(
        self, rollout: Rollout, mask: torch.Tensor, old_logp: torch.Tensor, behind: int
    ) -> dict[str, float]:
        """mismatch/*: the sampler's log-probs against the trainer's for the same tokens, warned about
        once past log.mismatch.kl_threshold (rlhf/rl/mismatch.py; docs/monitors.md)."""
        if not self.pretrain_done:
            return {}
        metrics, warning = self.mismatch.measure(
            self.iteration, rollout.logprobs, old_logp, mask,
            lambda sequences: self.runtime.forward("policy", sequences), rollout.sequences, behind,
        )  # fmt: skip
        if warning is not None:
            self.logger.warn(warning, step=self.iteration, code=MISMATCH)
        return metrics

    def require_finite_forwards(
        self,
        rollout: Rollout,
        mask: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor,
        values: torch.Tensor | None,
    ) -> None:
        """A NaN/inf log-prob or value inside a response stops the run before it reaches an advantage
        (rlhf/train/guards.py): a silent NaN turns every later weight into NaN."""
        outputs = [("the policy", "log-probs", old_logp), ("the reference", "log-probs", ref_logp)]
        outputs += [("the critic", "values", values)] if values is not None else []
        valid = mask.bool()
        if all(bool(torch.isfinite(t[valid]).all()) for _, _, t in outputs):
            return
        texts = self.runtime.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        when = (
            f"iteration {self.iteration}"
            if self.pretrain_done
            else f"critic pre-training iteration {self.pretrain_state.iterations}"
        )
        for model, quantity, tokens in outputs:
            require_finite_tokens(
                tokens,
                mask,
                model=model,
                quantity=quantity,
                what=f"responses at {when}:",
                row=lambda i: f"row {i} {texts[i][:60]!r}",
                consequence="Nothing of this iteration was used or saved; the last checkpoint is intact.",
                fix=self.nonfinite_fix(),
            )

    def nonfinite_fix(self) -> str:
        c = self.config
        return (
            f"a forward or a gradient went non-finite (dtype {c.dtype}, device {c.train.device}): "
            "see policy/ and value/skipped_step_fraction and the losses in metrics.jsonl; start again with "
            "--dtype float32, or lower --policy_optim.lr / --critic_optim.lr."
        )

    def experience_metrics(
        self,
        scored: Scored,
        experience: Experience,
        processed: torch.Tensor,
        kl: torch.Tensor,
        final_scores: torch.Tensor,
    ) -> Metrics:
        """The rollout monitors, group statistics when prompts are sampled in groups, reward parts
        (`processed`: the kept rows' processed scores; `final_scores`: them in place, 0 elsewhere)."""
        c, keep = self.config, scored.keep
        metrics = rollout_metrics(scored.rollout, experience, scored.raw_scores, processed, keep, kl,
                                  c.kl.estimator, self.kl_controller.value,
                                  with_values=self.runtime.has_role("critic"))  # fmt: skip
        if c.rollout.samples_per_prompt > 1:
            assert experience.group is not None  # make_experience gives every row its prompt's group
            metrics.update(group_metrics(final_scores, experience.group, keep))
        metrics.update(self.reward_parts)
        if self.episodes is not None:
            metrics.update(self.episodes.metrics())
        return metrics

    def sample_scored(self) -> Scored:
        """One more rollout, sampled and scored (a dynamic-sampling round)."""
        group, rollout, behind = self.take_rollout()
        return Scored(group, rollout, *self.score(rollout), behind)

    def score(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(raw scores [B]: the reward model's and/or the reward functions' weighted sum, scores after
        the truncation policy [B], rows kept [B])."""
        c, run = self.config, self.runtime
        raw_scores = run.forward("reward_model", rollout.sequences) if run.has_role("reward_model") else None
        if raw_scores is not None and not bool(torch.isfinite(raw_scores).all()):  # a broken RM stops the run
            texts = run.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
            require_finite_scores(
                raw_scores,
                model=f"the reward model {c.model.reward_model or '(given in code)'}",
                what=f"responses at iteration {self.iteration}:",
                row=lambda i: f"row {i} {texts[i][:60]!r}",
                consequence="Nothing of this iteration was used or saved; the last checkpoint is intact.",
                fix="the reward model is broken (diverged training or damaged weights): retrain it with "
                "`rlhf rm` (check its metrics.jsonl for a NaN loss) and start a new run.",
            )
        if self.remote_reward is not None:  # a reward server's scores, checked (docs/reward_server.md)
            raw_scores = self.remote_reward.score(rollout).to(rollout.response_mask.device)
        # Python reward functions, weighted, added to the RM's score (docs/algorithms.md §31)
        if self.reward_functions:
            raw_scores = self.function_rewards(rollout, raw_scores)
        if self.episodes is not None:  # the environment's rewards, summed over the turns, added
            env = self.episodes.rewards.to(rollout.response_mask.device)
            raw_scores = env if raw_scores is None else raw_scores + env
        assert raw_scores is not None
        # responses that hit max_new_tokens: keep, penalize or drop (docs/algorithms.md#5-truncated-responses)
        scores, keep = apply_truncation_policy(
            raw_scores,
            rollout.ended_with_eos,
            policy=c.rollout.truncated,
            penalty=c.rollout.truncation_penalty,
        )
        if c.reward.overlong_buffer > 0:  # soft overlong punishment (DAPO §3.4; docs/algorithms.md §37)
            buffer = overlong_buffer_tokens(c.reward.overlong_buffer, c.rollout.max_new_tokens)
            scores, penalty = shaped_scores(scores, rollout.response_lengths, c.rollout.max_new_tokens,
                                            buffer, c.reward.overlong_penalty_factor)  # fmt: skip
            self.reward_parts["reward/overlong_penalty"] = float(penalty.mean())
        return raw_scores, scores, keep

    def function_rewards(self, rollout: Rollout, model_scores: torch.Tensor | None) -> torch.Tensor:
        """``reward.model_weight * RM + sum_k weight_k * fn_k`` [B]; each part's mean kept for the metrics."""
        n = self.config.rollout.samples_per_prompt
        indices = [i for i in self.batch_indices for _ in range(n)]
        rows = [dict(self.prompt_rows[i]) if self.prompt_rows else {} for i in indices]
        prompts, responses, token_ids = rollout_texts(self.runtime.tokenizer, rollout)
        total, parts = weighted_reward(
            self.reward_functions,
            model_scores,
            self.config.reward.model_weight,
            prompts,
            responses,
            token_ids,
            rows,
            where=f"iteration {self.iteration}, ",
        )
        self.reward_parts = part_metrics(parts)
        return total

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
                if self.asynchronous and minibatch.is_weights is not None:  # decoupled PPO: each token's
                    # surrogate weighted (§34; None never: Experience sets 1s when not given)
                    minibatch.advantages = minibatch.advantages * minibatch.is_weights
                minibatches.append(minibatch)
        steps = self.runtime.train(self.runtime.learner_names(train_policy), minibatches)
        stats = mean_over_steps(steps)
        self.check_skipped_steps(stats)
        return {**stats, **self.runtime.learning_rates()}

    def check_skipped_steps(self, stats: dict[str, float]) -> None:
        """Warn when optimizer steps were skipped for NaN/inf gradients (rlhf/train/learner.py); stop
        when a learner skipped all of them in 3 updates in a row (rlhf/train/guards.py)."""
        for prefix, role in (("policy", "policy"), ("value", "critic")):
            skipped = stats.get(f"{prefix}/skipped_step_fraction", 0.0)
            if skipped:
                self.logger.warn(
                    f"the {role} skipped {skipped:.0%} of this update's optimizer steps: NaN/inf gradients "
                    "(its weights stay as they were for those steps)",
                    step=self.iteration,
                    code=NONFINITE_GRADIENTS,
                )
            self.skipped_streak.update(role, skipped, self.iteration, self.nonfinite_fix())

    # ----------------------------------------------------------------------------------------
    # checkpoints
    # ----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "pretrain_done": self.pretrain_done,
            "pretrain_state": self.pretrain_state.state_dict(),
            "score_processor": self.score_processor.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "prompts": self.prompts.state_dict(),
            "detector": self.detector.state_dict(),
            "rng": ckpt.rng_state({"shuffle": self.shuffle_generator}),
            "buffer": [asdict(e) for e in self.buffer],
            "pending": self.pending_state(),
        }

    def pending_state(self) -> list[dict[str, Any]]:
        """The rollouts sampled ahead (asynchronous), waited for, in their order: a resumed run trains
        on them as the uninterrupted one does, each as many versions behind."""
        states = []
        for i, p in enumerate(self.pending):
            rollout = p.handle.result()
            self.pending[i] = PendingRollout(p.group, p.indices, Ready(rollout), p.version)
            behind = self.runtime.policy_version - p.version
            states.append(
                {"group": p.group, "indices": p.indices, "rollout": asdict(rollout), "behind": behind}
            )
        return states

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
        self.prompts.load_state_dict(state["prompts"])
        self.detector.load_state_dict(state["detector"])
        ckpt.set_rng_state(state["rng"], {"shuffle": self.shuffle_generator})
        self.buffer = [Experience(**e).to(self.runtime.device) for e in state["buffer"]]
        for p in state["pending"]:
            version = self.runtime.policy_version - p["behind"]
            self.pending.append(
                PendingRollout(p["group"], list(p["indices"]), Ready(Rollout(**p["rollout"])), version)
            )


def warmup_iterations(config: RLConfig) -> int:
    """The RL iterations during which the policy's learning rate still warms up (rlhf/train/learner.py)."""
    steps, _ = optimizer_steps(config)
    o = config.policy_optim
    warmup = max(0, o.warmup_steps, math.ceil(o.warmup_fraction * steps))
    return math.ceil(warmup / max(1, config.train.ppo_epochs * config.train.minibatches))


def collapse_detector(config: RLConfig) -> CollapseDetector:
    """The collapse signature of PPO paper §5.2 over the rollout monitors."""
    col = config.log.collapse
    return CollapseDetector(
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


def mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """The stats of an update from those of its optimizer steps: the mean over the steps that have a
    key (each step is one minibatch's token mean), `_max`/`_min` keys by max/min."""
    merged: dict[str, list[float]] = {}
    for stats in steps:
        for key, value in stats.items():
            merged.setdefault(key, []).append(value)
    out = {}
    for key, values in merged.items():
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out


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


class SkippedStepStreak:
    """Stops a run whose learner skipped every optimizer step (NaN/inf gradients, rlhf/train/learner.py)
    in `patience` updates in a row: its weights no longer change, so going on only burns compute."""

    def __init__(self, patience: int = 3) -> None:
        self.patience = patience
        self.streaks: dict[str, int] = {}

    def update(self, role: str, skipped_fraction: float, iteration: int, fix: str) -> None:
        self.streaks[role] = self.streaks.get(role, 0) + 1 if skipped_fraction >= 1.0 else 0
        if self.streaks[role] >= self.patience:
            raise NonFiniteScoresError(
                f"the {role} skipped every optimizer step for NaN/inf gradients in {self.patience} updates in a "
                f"row (to iteration {iteration}): its weights stopped changing. The last checkpoint holds the "
                f"weights before. Fix: {fix}"
            )
