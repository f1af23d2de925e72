"""Environments for multi-turn episodes (`rlhf train --env module:Class`, docs/environments.md):
the protocol and its loading, the multi-turn rollout over the sampler's `generate`, and two
built-in environments (a calculator tool, a guessing game)."""

from rlhf.envs.protocol import EnvError, Environment, EnvironmentClass, check_step_result, load_environment
from rlhf.envs.rollout import Episodes, place_turn_rewards, run_episodes

__all__ = [
    "EnvError",
    "Environment",
    "EnvironmentClass",
    "Episodes",
    "check_step_result",
    "load_environment",
    "place_turn_rewards",
    "run_episodes",
]
