"""The run's monitors (docs/monitors.md): the collapse detector (PPO paper §5.2), the still-policy
check, the sampler/trainer mismatch and the samples log; each warns once, through the run's logger."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.models.sampling import Rollout
from rlhf.monitor import CollapseDetector, MetricsLogger
from rlhf.monitor.stillness import CODE as STILL_POLICY
from rlhf.monitor.stillness import StillPolicyCheck
from rlhf.rl.mismatch import CODE as MISMATCH
from rlhf.rl.mismatch import MismatchMonitor
from rlhf.rl.roles.assemble import optimizer_steps
from rlhf.rl.sample_log import SampleLog
from rlhf.rundir.directory import SilentLogger

Metrics = dict[str, Any]  # an iteration's metrics: numbers, and lists or flags (`reward/raw_scores`, `stop`)
Logger = MetricsLogger | SilentLogger


class RunMonitors:
    def __init__(self, config: RLConfig, tokenizer: Any) -> None:
        self.detector = collapse_detector(config)
        # a policy that does not move (a learning rate far too small): said once, with the fix
        self.still_check = StillPolicyCheck(
            config.policy_optim.lr, lora=config.model.lora.enabled, start=warmup_iterations(config)
        )
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
        rollout: Rollout,
        mask: torch.Tensor,
        old_logp: torch.Tensor,
        behind: int,
        policy_forward: Callable[[Any], torch.Tensor],
        logger: Logger,
    ) -> dict[str, float]:
        """mismatch/*: the sampler's log-probs against the trainer's for the same tokens, warned about
        once past log.mismatch.kl_threshold (rlhf/rl/mismatch.py; docs/monitors.md)."""
        metrics, warning = self.mismatch.measure(
            iteration, rollout.logprobs, old_logp, mask, policy_forward, rollout.sequences, behind
        )
        if warning is not None:
            logger.warn(warning, step=iteration, code=MISMATCH)
        return metrics


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
