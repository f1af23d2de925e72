"""The user's own agents (`rlhf train --agent module:function`, docs/environments.md): an
OpenAI-compatible server over the policy's sampler, the concurrent episodes' requests decoded
together, every assistant turn recorded with the sampler's token ids and log-probs and the
trajectories handed to the trainer in the `--env` rollout layout."""

from rlhf.agents.backends import model_backend, runtime_backend
from rlhf.agents.batcher import Batcher, Sampled, Sampling
from rlhf.agents.chat import Message, RequestError, ToolCall, normalize_messages, parse_tool_calls, render
from rlhf.agents.runner import AgentEpisodes, AgentError, AgentFunction, load_agent, run_agent_episodes
from rlhf.agents.server import ChatServer, Settings
from rlhf.agents.trajectory import State, Trajectory

__all__ = [
    "AgentEpisodes",
    "AgentError",
    "AgentFunction",
    "Batcher",
    "ChatServer",
    "Message",
    "RequestError",
    "Sampled",
    "Sampling",
    "Settings",
    "State",
    "ToolCall",
    "Trajectory",
    "load_agent",
    "model_backend",
    "normalize_messages",
    "parse_tool_calls",
    "render",
    "run_agent_episodes",
    "runtime_backend",
]
