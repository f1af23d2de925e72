"""`rlhf train --env module:Class`: multi-turn episodes against a Python environment
(docs/environments.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.config.keys import When, setting

# the episode settings apply to a run with an environment
WITH_ENV = When(
    "name",
    "set",
    says="--env MODULE:Class is given ({key})",
    fix="--env MODULE:Class",
    example="rlhf.envs.calculator:Calculator",
)


@dataclass
class EnvConfig:
    # the environment class as "module:Class" (`--env`); "": single-turn rollouts, no environment
    name: str = ""
    # policy turns per episode at most (a turn ends at the policy's EOS)
    max_turns: int = setting(4, ">= 1", unit="turns", when=WITH_ENV)
    # tokens of the whole response at most (policy turns and environment replies): a turn or a reply
    # that would pass it is cut there and the episode ends; 0: no limit beyond max_turns turns
    max_tokens: int = setting(0, ">= 0", unit="tokens", when=WITH_ENV)
    # where the environment's rewards go: "end", their sum as the episode's score at its last token;
    # "turn", each turn's reward at that turn's last token (the episode's total unchanged)
    reward_placement: Literal["end", "turn"] = setting("end", when=WITH_ENV)


def response_budget(env: EnvConfig, max_new_tokens: int) -> int:
    """The response tokens an episode may take: `env.max_tokens`, or max_turns turns of
    `max_new_tokens` (`rollout.max_new_tokens`) when it is 0 (replies count against it)."""
    return env.max_tokens or env.max_turns * max_new_tokens
