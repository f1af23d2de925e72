"""Multi-turn episodes as a rollout source (`--env module:Class`; docs/environments.md): one episode
per prompt row, one batched generate per turn (rlhf/envs/rollout.py), scored on the whole episode."""

from __future__ import annotations

import time
from typing import Any

from rlhf.config.env import response_budget
from rlhf.envs import EnvironmentClass, Episodes, run_episodes
from rlhf.rl.dapo import Scored
from rlhf.rl.episode_record import EpisodeRecord
from rlhf.rl.rollout_source import SampledRollouts


class EpisodeRollouts(SampledRollouts):
    """SampledRollouts whose rows are episodes of `environment`; `episodes`: the last batch's."""

    def __init__(
        self,
        *args: Any,
        environment: EnvironmentClass,
        prompt_rows: list[dict[str, Any]] | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.environment, self.prompt_rows = environment, prompt_rows
        self.episodes: Episodes | None = None

    def next_batch(self, iteration: int) -> Scored:
        c = self.config
        started = time.perf_counter()
        prompts, group, rows = self.draw_prompts()
        episodes = self.episodes = self.run_episodes(prompts, rows, iteration)
        sampled = time.perf_counter()
        # the episode's budget: turns and replies (rlhf/envs/rollout.py); the overlong penalty's L_max (§37)
        record = EpisodeRecord(episodes.rollout, response_budget(c.env, c.rollout.max_new_tokens))
        raw_scores, scores, keep = self.scorer.score(record, rows, iteration, env_rewards=episodes.rewards)
        metrics = {**self.scorer.parts, **episodes.metrics()}
        metrics.update({"time/generate": sampled - started, "time/score": time.perf_counter() - sampled})
        return Scored(group, episodes.rollout, raw_scores, scores, keep, 0, episodes.turn_rewards, metrics)

    def run_episodes(self, prompts: list[list[int]], rows: list[int], iteration: int) -> Episodes:
        """One episode of the environment per prompt row, to its end (rlhf/envs/rollout.py)."""
        c = self.config
        indices = [i for i in rows for _ in range(c.rollout.samples_per_prompt)]
        logprobs = self.sampler_logprobs(iteration)
        envs = [self.environment.episode(self.prompt_rows[i] if self.prompt_rows else {}, i) for i in indices]
        return run_episodes(
            lambda contexts: self.runtime.generate(contexts, logprobs),
            self.runtime.tokenizer,
            prompts,
            envs,
            self.environment,
            max_turns=c.env.max_turns,
            max_tokens=response_budget(c.env, c.rollout.max_new_tokens),
            rows=indices,
            return_logprobs=logprobs,
        )
