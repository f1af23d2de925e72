"""`rlhf train --agent module:function`: the user's own agent, run against an OpenAI-compatible
server over the policy's sampler, its token-exact trajectories trained on (docs/environments.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.config.checks import at_least, fraction, positive, require


@dataclass
class AgentConfig:
    # the agent as "module:function" (`--agent`), called as function(row, base_url, model) per episode,
    # sync or async, returning the episode's reward; "": no agent
    name: str = ""
    concurrency: int = 16  # episodes running at once; their pending requests are decoded in one batch
    timeout_s: float = 300.0  # an episode still running after this many seconds has failed
    # the reward of a failed episode (raised, timed out, returned no number); null: the episode is
    # dropped from the update (its tokens train nothing)
    failure_reward: float | None = 0.0
    # more than this fraction of a batch's episodes failed: the run stops (exit 2) naming the first error
    max_failure_fraction: float = 0.5
    max_turns: int = 8  # requests per episode answered by the policy; later ones get an empty reply
    # response tokens per episode (policy turns and the tool/user turns between them); a request
    # past it gets an empty reply; 0: max_turns x rollout.max_new_tokens
    max_tokens: int = 0
    batch_window_ms: float = 20.0  # a request waits at most this long for others to join its batch
    # per-turn rewards (a list returned by the function): "end" sums them at the last token; "turn"
    # puts each at its turn's last token (the episode's total unchanged)
    reward_placement: Literal["end", "turn"] = "end"

    def validate(self, prefix: str) -> None:
        at_least(self.concurrency, 1, f"{prefix}concurrency", " (episodes at once)")
        positive(self.timeout_s, f"{prefix}timeout_s", 300, " (seconds per episode)")
        fraction(self.max_failure_fraction, f"{prefix}max_failure_fraction", 0.5, closed=True)
        at_least(self.max_turns, 1, f"{prefix}max_turns", " (requests per episode)")
        at_least(self.max_tokens, 0, f"{prefix}max_tokens", " (0: max_turns x rollout.max_new_tokens)")
        at_least(self.batch_window_ms, 0, f"{prefix}batch_window_ms", " (milliseconds)")
        key = f"{prefix}failure_reward"
        value = self.failure_reward
        ok = value is None or (value == value and abs(value) != float("inf"))
        require(ok, key, value, "must be a finite number or null (drop failed episodes)", f"--{key} 0")


def agent_budget(agent: AgentConfig, max_new_tokens: int) -> int:
    """The response tokens an episode may take: `agent.max_tokens`, or max_turns turns of
    `max_new_tokens` (`rollout.max_new_tokens`) when it is 0."""
    return agent.max_tokens or agent.max_turns * max_new_tokens
