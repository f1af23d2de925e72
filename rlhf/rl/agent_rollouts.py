"""The user's agent as a rollout source (`--agent module:function`; docs/environments.md): one
episode per prompt row and sample, run against an OpenAI-compatible server over the policy's
sampler (rlhf/agents/runner.py), scored on the whole episode as `--env` episodes are."""

from __future__ import annotations

import logging
import time
from typing import Any

from rlhf.agents import AgentEpisodes, AgentFunction, run_agent_episodes, runtime_backend
from rlhf.config.agent import agent_budget
from rlhf.rl.dapo import Scored
from rlhf.rl.episode_record import EpisodeRecord
from rlhf.rl.rollout_source import SampledRollouts

logger = logging.getLogger("rlhf.agents")  # failed episodes, each with its message
SHOWN_FAILURES = 3  # of a batch's failed episodes, the first few are said


class AgentRollouts(SampledRollouts):
    """SampledRollouts whose rows are episodes of `agent`; `episodes`: the last batch's."""

    def __init__(
        self, *args: Any, agent: AgentFunction, prompt_rows: list[dict[str, Any]] | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.agent, self.prompt_rows = agent, prompt_rows
        self.episodes: AgentEpisodes | None = None

    def next_batch(self, iteration: int) -> Scored:
        c = self.config
        started = time.perf_counter()
        _, group, rows = self.draw_prompts()  # the agent renders its own prompts from the rows
        episodes = self.episodes = self.run_agent(rows, iteration)
        for failure in (episodes.failures or [])[:SHOWN_FAILURES]:
            logger.warning("iteration %d: agent %s: episode of %s", iteration, self.agent.name, failure)
        sampled = time.perf_counter()
        # the episode's budget (turns and context): the overlong penalty's L_max (§37)
        record = EpisodeRecord(episodes.rollout, agent_budget(c.agent, c.rollout.max_new_tokens))
        raw_scores, scores, keep = self.scorer.score(record, rows, iteration, env_rewards=episodes.rewards)
        if episodes.kept is not None:  # failed episodes, dropped (agent.failure_reward null)
            keep = keep & episodes.kept.to(keep.device)
        metrics = {**self.scorer.parts, **episodes.metrics()}
        metrics.update({"time/generate": sampled - started, "time/score": time.perf_counter() - sampled})
        return Scored(group, episodes.rollout, raw_scores, scores, keep, 0, episodes.turn_rewards, metrics)

    def run_agent(self, rows: list[int], iteration: int) -> AgentEpisodes:
        c = self.config
        indices = [i for i in rows for _ in range(c.rollout.samples_per_prompt)]
        context = self.runtime.policy_context
        return run_agent_episodes(
            self.agent,
            runtime_backend(self.runtime),
            self.runtime.tokenizer,
            [self.prompt_rows[i] if self.prompt_rows else {} for i in indices],
            c.agent,
            max_new_tokens=c.rollout.max_new_tokens,
            max_tokens=agent_budget(c.agent, c.rollout.max_new_tokens),
            model=c.model.policy or "policy",
            max_context=None if context is None else context - c.rollout.max_new_tokens,
            return_logprobs=self.sampler_logprobs(iteration),
        )
