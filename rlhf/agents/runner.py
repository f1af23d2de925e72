"""`--agent module:function`: the user's agent run for a batch of episodes against the server, and
its recorded trajectories assembled into the trainer's rollout layout (the one `--env` gives):
`response_mask` 1 on the policy's sampled tokens alone.

    function(row: dict, base_url: str, model: str) -> float | list[float]     (or `async def`)

Up to `agent.concurrency` episodes at once (threads, or tasks of one event loop); this thread runs
the sampler over their requests (rlhf/agents/batcher.py). An episode that raises, times out, returns
no number or sent no request has failed: reward `agent.failure_reward` (dropped when null); more than
`agent.max_failure_fraction` of a batch failing stops the run (exit 2)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import numbers
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import torch

from rlhf.agents.batcher import Backend, Batcher
from rlhf.agents.server import ChatServer, Episode, Settings
from rlhf.agents.trajectory import State
from rlhf.config import AgentConfig, ConfigError
from rlhf.config.outside import outside_number
from rlhf.data.collate import left_pad
from rlhf.envs import Episodes
from rlhf.envs.protocol import working_directory_importable
from rlhf.models.sampling import Rollout

KEY = "agent.name"
POLL_S = 0.05  # how often the loop looks at finished and overdue episodes while no batch is due


class AgentError(ConfigError):
    """An agent function that cannot be loaded, or too many failed episodes (exit 2)."""


@dataclass(frozen=True)
class AgentFunction:
    name: str  # "module:function", as the user wrote it
    function: Callable[..., Any]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def load_agent(name: str) -> AgentFunction:
    """Import the function `module:function` names, checked to take (row, base_url, model)."""
    module_name, _, attribute = str(name).partition(":")
    if not module_name or not attribute:
        raise AgentError(
            f"{KEY} is {name!r}: name the module and the function, as 'module:function'. "
            "Fix: --agent package.module:function.", KEY
        )  # fmt: skip
    working_directory_importable()
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except (Exception, SystemExit) as err:  # the user's module: whatever it raises is named
        sys.modules.pop(module_name, None)
        raise AgentError(
            f"{KEY} {name!r}: importing module {module_name!r} failed{_where(err)}: {type(err).__name__}: {err}. "
            f"Fix: import it in Python (python -c 'import {module_name}') and correct what fails.", KEY
        ) from None  # fmt: skip
    function: Any = module
    for part in attribute.split("."):
        function = getattr(function, part, None)
    if not callable(function) or inspect.isclass(function):
        raise AgentError(
            f"{KEY} {name!r}: module {module_name!r} has no function {attribute!r}. Fix: name a function "
            "def agent(row, base_url, model) -> float defined in it.", KEY
        )  # fmt: skip
    try:
        inspect.signature(function).bind({}, "", "")
    except TypeError as err:
        raise AgentError(
            f"{KEY} {name!r} cannot be called as {attribute}(row, base_url, model) ({err}). "
            "Fix: define def agent(row: dict, base_url: str, model: str) -> float.", KEY
        ) from None  # fmt: skip
    except ValueError:  # a signature inspect cannot read: tried when an episode runs
        pass
    return AgentFunction(str(name), function)


def _where(err: BaseException) -> str:
    """` at FILE:LINE` of the innermost frame of the user's code."""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if "/rlhf/agents/" not in f.filename.replace("\\", "/")
    ]
    frames = [f for f in frames if "importlib" not in f.filename and "/concurrent/" not in f.filename]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


@dataclass
class AgentEpisodes(Episodes):
    """The batch's episodes (the `--env` layout) and what the agent said of each."""

    kept: torch.Tensor | None = None  # [B] bool: False for a failed episode dropped (failure_reward null)
    failures: list[str] | None = None  # each failed episode's message, in row order
    counts: dict[str, float] | None = None  # agent/* monitors

    def metrics(self) -> dict[str, float]:
        return dict(self.counts or {})


@dataclass
class _Run:
    index: int
    row: dict[str, Any]
    url: str
    episode: Episode
    future: Future[Any]
    started: float
    outcome: Any = None
    error: str | None = None
    done: bool = False


def run_agent_episodes(
    agent: AgentFunction,
    backend: Backend,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    config: AgentConfig,
    *,
    max_new_tokens: int,
    max_tokens: int,
    model: str = "policy",
    max_context: int | None = None,
    honours_sampling: bool = False,
    return_logprobs: bool = False,
) -> AgentEpisodes:
    """One episode of `agent` per row (`rows[i]`: the prompt file's record), to its end; the batch
    in the trainer's rollout layout. `backend` samples each batch of requests (`honours_sampling`:
    with the requests' temperature and top_p; else with its own); `max_new_tokens` per turn,
    `max_tokens` per episode's response block; a request whose context passes `max_context` tokens
    is answered empty (the episode's limit)."""
    batcher = Batcher(backend, window_s=config.batch_window_ms / 1000, honours_sampling=honours_sampling)
    server = ChatServer(tokenizer, batcher, Settings(model, max_new_tokens, max_context))
    loop = _event_loop() if agent.is_async else None
    runs: list[_Run] = []
    try:
        waiting = list(range(len(rows)))
        while waiting or any(not r.done for r in runs):
            running = [r for r in runs if not r.done]
            while waiting and len(running) < config.concurrency:
                index = waiting.pop(0)
                url, episode = server.open_episode(config.max_turns, max_tokens)
                run = _Run(index, dict(rows[index]), url, episode, _start(agent, rows[index], url, model, loop),
                           time.monotonic())  # fmt: skip
                runs.append(run)
                running.append(run)
            batch = batcher.take(len(running), POLL_S)
            if batch:
                batcher.run(batch)
            _finish(runs, config.timeout_s)
    finally:
        for r in runs:
            r.episode.closed = True
        batcher.fail_all("the batch of episodes is over")
        server.close()
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
    runs.sort(key=lambda r: r.index)
    episodes = _assemble(runs, tokenizer, config, return_logprobs)
    episodes.counts = dict(episodes.counts or {})
    episodes.counts["agent/batch_size_mean"] = sum(batcher.batches) / max(1, len(batcher.batches))
    failed = [r for r in runs if r.error is not None]
    if len(failed) > config.max_failure_fraction * len(runs):
        raise AgentError(
            f"{KEY} {agent.name}: {len(failed)} of {len(runs)} episodes failed, more than "
            f"agent.max_failure_fraction {config.max_failure_fraction}; the first, on prompt row {failed[0].index}: "
            f"{failed[0].error}. Fix: run the function on one row by hand against a server and correct it, or "
            "raise --agent.timeout_s / --agent.max_failure_fraction.", KEY
        )  # fmt: skip
    return episodes


def _event_loop() -> asyncio.AbstractEventLoop:
    """An event loop on a daemon thread of its own; once stopped, its tasks left (episodes past the
    timeout) are cancelled and it is closed."""
    loop = asyncio.new_event_loop()

    def run() -> None:
        loop.run_forever()
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.close()

    threading.Thread(target=run, name="rlhf-agent-loop", daemon=True).start()
    return loop


def _start(
    agent: AgentFunction, row: dict[str, Any], url: str, model: str, loop: asyncio.AbstractEventLoop | None
) -> Future[Any]:
    """The episode started: on the event loop (async) or a daemon thread of its own (sync: a hung
    function is left behind, never joined)."""
    if loop is not None:
        return asyncio.run_coroutine_threadsafe(agent.function(dict(row), url, model), loop)
    future: Future[Any] = Future()

    def episode() -> None:
        try:
            result = agent.function(dict(row), url, model)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        except BaseException as err:  # the user's code: whatever it raises fails the episode
            with contextlib.suppress(InvalidStateError):  # cancelled: it ran past the timeout
                future.set_exception(err)
            return
        with contextlib.suppress(InvalidStateError):
            future.set_result(result)

    threading.Thread(target=episode, name="rlhf-agent-episode", daemon=True).start()
    return future


async def _awaited(result: Any) -> Any:
    return await result


def _finish(runs: list[_Run], timeout_s: float) -> None:
    """Mark the episodes whose function returned (or raised), and those past the timeout."""
    now = time.monotonic()
    for r in runs:
        if r.done:
            continue
        if r.future.done():
            r.done = True
            try:
                r.outcome = r.future.result()
            except BaseException as err:
                r.error = f"raised {type(err).__name__}: {err}{_where(err)}"
        elif now - r.started > timeout_s:
            r.done = True
            r.future.cancel()  # an async episode's task is cancelled; a thread is left behind
            r.error = f"still running after {timeout_s:g} s (agent.timeout_s)"
        if r.done:
            r.episode.closed = True


def _rewards(r: _Run, state: State | None) -> list[float] | None:
    """Each turn's reward from what the function returned (a number: at the last turn), or None
    with `r.error` set."""
    if r.error is not None:
        return None
    if state is None:
        r.error = "sent no request to base_url that the policy answered (nothing to train on)"
        return None
    turns = len(state.turn_ends)
    value = r.outcome
    try:
        if _number(value):
            return [0.0] * (turns - 1) + [_reward(value)]
        if isinstance(value, (list, tuple)) and value and all(_number(v) for v in value):
            if len(value) != turns:
                r.error = f"returned {len(value)} per-turn rewards for {turns} turns of its trajectory"
                return None
            return [_reward(v) for v in value]
    except _Unusable as err:  # NaN, inf, or beyond float32 (1e39, 10**400)
        r.error = str(err).split(". Fix:")[0]
        return None
    r.error = f"returned {value!r} ({type(value).__name__}), not a number or a list of per-turn numbers"
    return None


class _Unusable(ValueError):
    pass


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _reward(value: Any) -> float:
    """A reward the agent returned, through the one check of outside numbers (rlhf/config/outside.py)."""
    return outside_number(value, "returned the reward", "return finite rewards on a sane scale", _Unusable)


def _assemble(runs: list[_Run], tokenizer: Any, config: AgentConfig, return_logprobs: bool) -> AgentEpisodes:
    """The episodes in the trainer's rollout layout (rlhf/envs/rollout.py's module docstring)."""
    states = [r.episode.trajectory.last for r in runs]
    rewards = [_rewards(r, s) for r, s in zip(runs, states)]
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([list(s.prompt) if s else [pad] for s in states], pad)
    width = max(1, max(len(s.tokens) if s else 0 for s in states))
    batch = len(runs)
    response = torch.full((batch, width), pad, dtype=torch.long)
    real = torch.zeros(batch, width, dtype=torch.long)
    policy, logprobs, turn_rewards = (
        torch.zeros(batch, width),
        torch.zeros(batch, width),
        torch.zeros(batch, width),
    )
    kept = torch.ones(batch, dtype=torch.bool)
    totals = torch.zeros(batch)
    for i, (s, reward) in enumerate(zip(states, rewards)):
        if reward is None:  # failed: the failure reward at the last turn, or dropped
            kept[i] = config.failure_reward is not None
            reward = [float(config.failure_reward or 0.0)]
        totals[i] = sum(reward)
        if s is None:
            continue
        n = len(s.tokens)
        response[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        real[i, :n] = 1
        policy[i, :n] = torch.tensor(s.policy, dtype=torch.float)
        logprobs[i, :n] = torch.tensor(s.logprobs)
        ends = list(s.turn_ends)[-len(reward) :]
        for end, value in zip(ends, reward[-len(ends) :] if ends else []):
            turn_rewards[i, end] += value
    rollout = Rollout(
        input_ids=torch.cat([prompt_ids, response], dim=1),
        attention_mask=torch.cat([prompt_mask, real], dim=1),
        prompt_length=prompt_ids.shape[1],
        response_mask=policy,
        ended_with_eos=torch.tensor([bool(s and s.ended_with_eos) for s in states]),
        logprobs=logprobs if return_logprobs else None,
    )
    trajectories = [r.episode.trajectory for r in runs]
    failures = [f"prompt row {r.index}: {r.error}" for r in runs if r.error is not None]
    context = (real.sum(-1) - policy.sum(-1)).float()
    counts = {
        "agent/reward_mean": float(totals.mean()),
        "agent/failed_fraction": len(failures) / max(1, batch),
        "agent/turns_mean": sum(t.turns for t in trajectories) / max(1, batch),
        "agent/tool_calls_mean": sum(t.tool_calls for t in trajectories) / max(1, batch),
        "agent/segments_mean": sum(t.segments for t in trajectories) / max(1, batch),
        "agent/context_tokens_mean": float(context.mean()),
        "agent/errors": float(sum(r.episode.errors for r in runs)),
        "agent/limited": float(sum(r.episode.limited for r in runs)),
    }
    return AgentEpisodes(
        rollout=rollout,
        rewards=totals,
        turn_rewards=turn_rewards,
        turns=torch.tensor([len(s.turn_ends) if s else 0 for s in states]),
        done=torch.tensor([r.error is None for r in runs]),
        transcripts=[tokenizer.decode(list(s.tokens), skip_special_tokens=True) if s else "" for s in states],
        kept=kept,
        failures=failures,
        counts=counts,
    )
