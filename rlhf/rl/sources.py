"""The run's rollout source, from its config (rlhf/rl/rollout_source.py)."""

from __future__ import annotations

from typing import Any

from rlhf.agents import load_agent
from rlhf.config import RLConfig
from rlhf.envs import load_environment
from rlhf.rl.agent_rollouts import AgentRollouts
from rlhf.rl.async_rollouts import AsyncRollouts
from rlhf.rl.dapo import DynamicSampling
from rlhf.rl.episode_rollouts import EpisodeRollouts
from rlhf.rl.mismatch import MismatchMonitor
from rlhf.rl.online_dpo import PreferencePairs
from rlhf.rl.prompts import PromptStream
from rlhf.rl.rollout_source import RolloutSource, SampledRollouts
from rlhf.rl.scorer import Scorer
from rlhf.runtime.protocol import Runtime


def rollout_source(
    config: RLConfig,
    runtime: Runtime,
    prompts: list[list[int]],
    scorer: Scorer,
    mismatch: MismatchMonitor,
    prompt_rows: list[dict[str, Any]] | None = None,
) -> RolloutSource:
    """Episodes under `env.name` or `agent.name`, asynchronous under `rollout.max_staleness` > 0, else synchronous;
    wrapped in online DPO's pairs under `policy.loss online_dpo` and in DAPO's dynamic sampling under
    `rollout.dynamic_sampling`."""
    c = config.rollout
    args = (config, runtime, PromptStream(prompts, seed=config.seed), scorer, mismatch)
    source: RolloutSource
    if config.env.name:  # multi-turn episodes (docs/environments.md)
        source = EpisodeRollouts(
            *args, environment=load_environment(config.env.name), prompt_rows=prompt_rows
        )
    elif config.agent.name:  # the user's agent against a server over the sampler
        source = AgentRollouts(*args, agent=load_agent(config.agent.name), prompt_rows=prompt_rows)
    elif c.max_staleness > 0:  # sampled ahead by the rollout actors (§34)
        source = AsyncRollouts(*args)
    else:
        source = SampledRollouts(*args)
    if config.policy.loss == "online_dpo":  # each prompt's two responses: a pair, or dropped on a tie (§45)
        source = PreferencePairs(source)
    if c.dynamic_sampling:  # groups of equal scores dropped and refilled (DAPO §3.2; §36)
        source = DynamicSampling(
            source, c.batch_size, c.max_sampling_rounds, runtime.tokenizer.pad_token_id or 0
        )
    return source
