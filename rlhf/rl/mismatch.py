"""The sampler/trainer log-prob gap as a monitor (`log.mismatch`; docs/monitors.md#sampler-trainer-mismatch).

The sampler returns the log-prob of each token it drew (its KV-cached decode); the trainer computes
the old log-probs of the same tokens in one forward. With the same weights they differ by numerics
only: ~1e-7 in float32, more in bfloat16, and much more when a sampler engine, kernel or weight sync
goes wrong. The gap is measured where it costs nothing (the trainer's forward runs anyway), or with
one more policy forward every `extra_forward_every` iterations under rollout.logprobs_from_sampler.
An asynchronous rollout sampled by an older policy (`behind` > 0) is not measured: its gap is the
staleness, which decoupled PPO corrects (async/* metrics).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhf.config import RLConfig
from rlhf.core.mismatch import sampler_mismatch
from rlhf.models.sequences import Sequences

CODE = "sampler_trainer_mismatch"  # the `code` of the warning's event in metrics.jsonl


class MismatchMonitor:
    def __init__(self, config: RLConfig):
        self.settings = config.log.mismatch
        # the trainer skips its own old-log-prob forward: measuring costs one more
        self.extra_forward = config.rollout.logprobs_from_sampler and config.rollout.max_staleness == 0
        self.warned = False

    def due(self, iteration: int) -> bool:
        """Measured at this iteration (the sampler is asked for its log-probs)."""
        every = self.settings.extra_forward_every if self.extra_forward else self.settings.every
        return every > 0 and iteration % every == 0

    def measure(
        self,
        iteration: int,
        sampler_logp: torch.Tensor | None,
        trainer_logp: torch.Tensor,
        mask: torch.Tensor,
        policy_forward: Callable[[Sequences], torch.Tensor],
        sequences: Sequences,
        behind: int = 0,
    ) -> tuple[dict[str, float], str | None]:
        """(the mismatch/* metrics, a warning to log once) of this iteration's rollout; ({}, None) when
        not measured. `trainer_logp`: the old log-probs the loop uses (the sampler's own under
        rollout.logprobs_from_sampler, then recomputed here by `policy_forward`)."""
        if sampler_logp is None or behind or not self.due(iteration):
            return {}, None
        if self.extra_forward:
            trainer_logp = policy_forward(sequences)
        metrics = sampler_mismatch(sampler_logp, trainer_logp, mask)
        threshold = self.settings.kl_threshold
        if threshold is None or self.warned or not metrics["mismatch/kl"] > threshold:
            return metrics, None
        self.warned = True  # said once a run
        return metrics, (
            f"the sampler's and the trainer's log-probs of the same tokens differ: mismatch/kl "
            f"{metrics['mismatch/kl']:.3g} > log.mismatch.kl_threshold {threshold:g} (max ratio "
            f"{metrics['mismatch/max_ratio']:.4g}, mean |diff| {metrics['mismatch/mean_abs_diff']:.3g}); "
            "the responses come from another distribution than the one trained (and under "
            "rollout.logprobs_from_sampler the PPO ratio starts away from 1). Fix: look for what differs "
            "between sampling and training (weights not synced, temperature, kernels), try --dtype float32, "
            "or raise --log.mismatch.kl_threshold if this gap is expected."
        )
