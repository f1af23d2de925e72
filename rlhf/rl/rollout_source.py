"""Rollout sources: where the loop's batches come from, sampled and scored.

A source hands the loop one `Scored` batch per `next_batch` (rlhf/rl/dapo.py). The sources
(rlhf/rl/sources.py picks them from the config): `SampledRollouts` (synchronous), `AsyncRollouts`
(sampled ahead, at most rollout.max_staleness behind; docs/algorithms.md §34), `EpisodeRollouts`
(`--env`), `AgentRollouts` (`--agent`) and `DynamicSampling` (DAPO's, §36).

A new source is one class with the four methods of `RolloutSource`; it scores its batches with the
run's Scorer (rlhf/rl/scorer.py) so that every shaping of the run applies to them."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from rlhf.config import RLConfig
from rlhf.models.sampling import Rollout
from rlhf.rl.dapo import Scored
from rlhf.rl.episode_record import EpisodeRecord
from rlhf.rl.groups import sample_groups
from rlhf.rl.mismatch import MismatchMonitor
from rlhf.rl.prompts import PromptStream
from rlhf.rl.scorer import Scorer
from rlhf.runtime.protocol import Runtime


class RolloutSource(Protocol):
    """What the loop asks of its batches' source: one scored batch per call, a chance to sample
    during the update, and its state for checkpoints (the keys `prompts` and `pending` today)."""

    def next_batch(self, iteration: int) -> Scored:
        """The next batch, sampled and scored, for `iteration` (its metrics in `Scored.metrics`)."""
        ...

    def sample_ahead(self, iteration: int) -> None:
        """The update of `iteration` begins: sample what may be sampled meanwhile (AsyncRollouts)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed run draws the batches the uninterrupted one would."""
        ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class SampledRollouts:
    """Synchronous rollouts: the next `rollout.batch_size` prompts, each `samples_per_prompt` times
    (one group each, docs/algorithms.md §27), sampled by the current policy and scored."""

    def __init__(
        self,
        config: RLConfig,
        runtime: Runtime,
        prompts: PromptStream,
        scorer: Scorer,
        mismatch: MismatchMonitor,
    ) -> None:
        self.config, self.runtime, self.prompts = config, runtime, prompts
        self.scorer, self.mismatch = scorer, mismatch

    def draw_prompts(self) -> tuple[list[list[int]], torch.Tensor, list[int]]:
        """(the prompts, each repeated samples_per_prompt times; group ids; the prompt file's rows)."""
        c = self.config.rollout
        prompts, group = sample_groups(self.prompts.next_batch(c.batch_size), c.samples_per_prompt)
        return prompts, group, list(self.prompts.last_indices)

    def next_batch(self, iteration: int) -> Scored:
        started = time.perf_counter()
        prompts, group, rows = self.draw_prompts()
        rollout = self.runtime.generate(prompts, self.sampler_logprobs(iteration))
        return self.score(group, rows, rollout, iteration, started)

    def sampler_logprobs(self, iteration: int) -> bool:
        """Whether the sampler keeps its log-probs: trained on (rollout.logprobs_from_sampler),
        corrected against (rollout.correction, §44) or measured (mismatch/*). In episodes they are
        the policy's turns' (0 on the context, which the response mask leaves out)."""
        r = self.config.rollout
        return r.logprobs_from_sampler or r.correction.enabled or self.mismatch.due(iteration)

    def score(
        self,
        group: torch.Tensor,
        rows: list[int],
        rollout: Rollout,
        iteration: int,
        started: float,
        behind: int = 0,
    ) -> Scored:
        """The rollout scored as single-turn responses of budget rollout.max_new_tokens."""
        sampled = time.perf_counter()
        record = EpisodeRecord(rollout, self.config.rollout.max_new_tokens)
        raw_scores, scores, keep = self.scorer.score(record, rows, iteration)
        timing = {"time/generate": sampled - started, "time/score": time.perf_counter() - sampled}
        return Scored(
            group, rollout, raw_scores, scores, keep, behind, metrics={**self.scorer.parts, **timing}
        )

    def sample_ahead(self, iteration: int) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {"prompts": self.prompts.state_dict(), "pending": []}

    def load_state(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
