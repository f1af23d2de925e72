"""The run's monitors (docs/monitors.md): the collapse detector (PPO paper §5.2), the still-policy
check, the sampler/trainer mismatch and the samples log; each warns once, through the run's logger."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.monitor import CollapseDetector, MetricsLogger
from rlhf.monitor.stillness import CODE as STILL_POLICY
from rlhf.monitor.stillness import StillPolicyCheck
from rlhf.rl.dapo import Scored
from rlhf.rl.mismatch import CODE as MISMATCH
from rlhf.rl.mismatch import MismatchMonitor
from rlhf.rl.roles.assemble import optimizer_steps
from rlhf.rl.sample_log import SampleLog
from rlhf.rundir.directory import SilentLogger, open_metrics_logger
from rlhf.runtime.protocol import Runtime

Metrics = dict[str, Any]  # an iteration's metrics: numbers, and lists or flags (`reward/raw_scores`, `stop`)
Logger = MetricsLogger | SilentLogger
# on the console line; the KL is k3's, never negative (kl/ref, the configured estimator, may be: k1)
KEY_METRICS = ("reward/raw_mean", "kl/k3", "policy_ppl", "response/length_mean", "policy/clip_fraction")


class RunMonitors:
    def __init__(self, config: RLConfig, tokenizer: Any) -> None:
        self.detector = collapse_detector(config)
        # a policy that does not move (a learning rate far too small): said once, with the fix
        self.still_check = StillPolicyCheck.of(config, start=warmup_iterations(config))
        self.mismatch = MismatchMonitor(config)  # sampler vs trainer log-probs of the same tokens
        self.samples = SampleLog(config, tokenizer)  # samples.jsonl rows of the logged iterations

    def observe(self, iteration: int, metrics: Metrics, logger: Logger) -> list[str]:
        """The collapse signature (PPO paper §5.2; sets metrics["collapse"]) and the still-policy
        check over this iteration's metrics, warned; the collapse detector's new warnings."""
        warnings = self.detector.update(iteration, metrics)
        metrics["collapse"] = bool(warnings) or bool(self.detector.fired)
        for message in warnings:
            logger.warn(message, step=iteration)
        still = self.still_check.update(iteration, metrics)
        if still is not None:
            logger.warn(still, step=iteration, code=STILL_POLICY)
        return warnings

    def mismatch_metrics(
        self,
        iteration: int,
        scored: Scored,
        mask: torch.Tensor,
        old_logp: torch.Tensor,
        runtime: Runtime,
        logger: Logger,
    ) -> dict[str, float]:
        """mismatch/*: the sampler's log-probs against the trainer's for the same tokens, warned about
        once past log.mismatch.kl_threshold (rlhf/rl/mismatch.py; docs/monitors.md)."""
        rollout = scored.rollout
        metrics, warning = self.mismatch.measure(
            iteration, rollout.logprobs, old_logp, mask,
            lambda sequences: runtime.forward("policy", sequences), rollout.sequences, scored.behind,
        )  # fmt: skip
        if warning is not None:
            logger.warn(warning, step=iteration, code=MISMATCH)
        return metrics


def open_run_logger(
    config: RLConfig, run_dir: Path, writer: bool, iteration: int, resume: bool, quiet: bool
) -> Logger:
    """The run's metrics.jsonl (and console, unless `quiet`), appended to when resuming at `iteration`."""
    return open_metrics_logger(
        run_dir,
        resumable=True,
        sinks=tuple(config.log.sinks) if not quiet else ("jsonl",),
        # each phase in its own units: `pretrain i/P`, then `iteration i/N`
        total={
            "pretrain": config.critic.pretrain_iterations if config.uses_critic else 0,
            "iteration": config.train.iterations,
        },  # fmt: skip
        indexed=True,  # `iteration` and `pretrain` are 0-based: record i is the (i+1)-th done
        key_metrics=KEY_METRICS,
        resume=resume,
        resume_step=iteration - 1 if resume else None,
        writer=writer,  # under torchrun, rank 0 alone writes
    )


def warmup_iterations(config: RLConfig) -> int:
    """The RL iterations during which the policy's learning rate still warms up (rlhf/train/optimizer.py)."""
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
