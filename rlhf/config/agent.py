"""`rlhf train --agent module:function`: the user's own agent, run against an OpenAI-compatible
server over the policy's sampler, its token-exact trajectories trained on (docs/environments.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.config.keys import When, setting

# the episode settings apply to a run with an agent
WITH_AGENT = When(
    "name",
    "set",
    says="--agent module:function is given ({key})",
    fix="--agent module:function",
    example="m:f",
)


@dataclass
class AgentConfig:
    # the agent as "module:function" (`--agent`), called as function(row, base_url, model) per episode,
    # sync or async, returning the episode's reward; "": no agent
    name: str = ""
    # episodes running at once; their pending requests are decoded in one batch
    concurrency: int = setting(16, ">= 1", unit="episodes", when=WITH_AGENT)
    # an episode still running after this many seconds has failed
    timeout_s: float = setting(300.0, "> 0", unit="seconds", when=WITH_AGENT)
    # the reward of a failed episode (raised, timed out, returned no number); null: the episode is
    # dropped from the update (its tokens train nothing)
    failure_reward: float | None = setting(0.0, "any", why="a reward, of either sign", when=WITH_AGENT)
    # more than this fraction of a batch's episodes failed: the run stops (exit 2) naming the first error
    max_failure_fraction: float = setting(0.5, "[0, 1]", when=WITH_AGENT)
    # requests per episode answered by the policy; later ones get an empty reply
    max_turns: int = setting(8, ">= 1", unit="requests", when=WITH_AGENT)
    # response tokens per episode (policy turns and the tool/user turns between them); a request
    # past it gets an empty reply; 0: max_turns x rollout.max_new_tokens
    max_tokens: int = setting(0, ">= 0", unit="tokens", when=WITH_AGENT)
    # a request waits at most this long for others to join its batch
    batch_window_ms: float = setting(20.0, ">= 0", unit="milliseconds", when=WITH_AGENT)
    # per-turn rewards (a list returned by the function): "end" sums them at the last token; "turn"
    # puts each at its turn's last token (the episode's total unchanged)
    reward_placement: Literal["end", "turn"] = setting("end", when=WITH_AGENT)


def agent_budget(agent: AgentConfig, max_new_tokens: int) -> int:
    """The response tokens an episode may take: `agent.max_tokens`, or max_turns turns of
    `max_new_tokens` (`rollout.max_new_tokens`) when it is 0."""
    return agent.max_tokens or agent.max_turns * max_new_tokens
