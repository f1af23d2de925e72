"""Token-exact trajectories of one episode: what the policy sampled, turn by turn, and the context
between its turns, matched against each new request of the agent.

A *state* is the trajectory after an answered request: the prompt's tokens, then per turn the context
tokens (policy 0) and the sampled tokens (policy 1, with the sampler's log-probs). A new request whose
messages begin with a state's conversation (`Message.same_turn`) continues it, its new turns tokenized
as the difference of the chat template's two renderings, so an assistant turn is never tokenized
again; a request no state explains starts a new *segment* from its own rendered prompt. The episode's
trajectory is the state of its last answered request (its first choice when `n` > 1)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rlhf.agents.chat import Message, RequestError, render

_PROBE = "\x00rlhf-agent-probe\x00"  # an assistant text no template rewrites, to find what follows it


@dataclass(frozen=True)
class State:
    prompt: tuple[int, ...]  # the segment's first prompt, rendered by the template
    tokens: tuple[int, ...]  # the response block so far: turns and the context between them
    policy: tuple[bool, ...]  # per token: sampled by the policy (True) or context (False)
    logprobs: tuple[float, ...]  # the sampler's log-prob per token, 0 on context
    turn_ends: tuple[int, ...]  # the position in `tokens` of each turn's last token
    messages: tuple[Message, ...]  # the conversation, ending with the assistant's answer
    tools_key: str  # the request's tools, as JSON: a request with other tools does not continue it
    ended_with_eos: bool
    segment: int


@dataclass
class Prepared:
    """A request matched to the trajectory: the tokens to sample after, and where they come from."""

    context: list[int]  # the whole token context of the request (prompt + response block so far)
    base: State | None  # the state it continues; None: a new segment
    new_tokens: list[int]  # context tokens added by this request (the whole prompt for a new segment)
    messages: tuple[Message, ...]
    tools_key: str


@dataclass
class Trajectory:
    """One episode's states; thread-safe (an agent may send requests from several threads)."""

    tokenizer: Any
    states: list[State] = field(default_factory=list)
    last: State | None = None
    segments: int = 0
    turns: int = 0
    tool_calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(
        self, messages: tuple[Message, ...], tools: list[dict[str, Any]] | None, tools_key: str
    ) -> Prepared:
        """The request's token context: continuing the state whose conversation it extends the most,
        else a new segment."""
        with self.lock:
            candidates = [
                s for s in self.states if s.tools_key == tools_key and _extends(messages, s.messages)
            ]
        for state in sorted(candidates, key=lambda s: len(s.messages), reverse=True):
            added = self._context_after(state, messages, tools)
            if added is not None:
                return Prepared(list(state.prompt + state.tokens) + added, state, added, messages, tools_key)
        prompt = self.encode(render(self.tokenizer, messages, tools, generation=True))
        if not prompt:
            raise RequestError("the messages render to no tokens")
        return Prepared(prompt, None, prompt, messages, tools_key)

    def record(self, prepared: Prepared, tokens: list[int], logprobs: list[float], ended_with_eos: bool,
               answer: Message) -> State:  # fmt: skip
        """The state after the policy's answer (`tokens`, `logprobs`: what the sampler produced)."""
        base = prepared.base
        with self.lock:
            if base is None:
                self.segments += 1
                prompt = tuple(prepared.new_tokens)
                prefix: tuple[int, ...] = ()
                policy: tuple[bool, ...] = ()
                logp: tuple[float, ...] = ()
                ends: tuple[int, ...] = ()
                segment = self.segments
            else:
                prompt, segment, ends = base.prompt, base.segment, base.turn_ends
                prefix = base.tokens + tuple(prepared.new_tokens)
                policy = base.policy + (False,) * len(prepared.new_tokens)
                logp = base.logprobs + (0.0,) * len(prepared.new_tokens)
            state = State(
                prompt=prompt,
                tokens=prefix + tuple(tokens),
                policy=policy + (True,) * len(tokens),
                logprobs=logp + tuple(float(x) for x in logprobs),
                turn_ends=ends + ((len(prefix) + len(tokens) - 1,) if tokens else ()),
                messages=prepared.messages + (answer,),
                tools_key=prepared.tools_key,
                ended_with_eos=ended_with_eos,
                segment=segment,
            )
            self.states.append(state)
            return state

    def answered(self, state: State, tool_calls: int) -> None:
        """`state` (the first choice) is the episode's trajectory until a later request is answered."""
        with self.lock:
            self.last = state
            self.turns += 1
            self.tool_calls += tool_calls

    def encode(self, text: str) -> list[int]:
        # a chat template writes its own BOS text: adding special tokens would double it
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _context_after(
        self, state: State, messages: tuple[Message, ...], tools: list[dict[str, Any]] | None
    ) -> list[int] | None:
        """The context tokens between `state`'s last turn and the new request's generation: what the
        template writes after the assistant's text (its end-of-turn marker, less the one the policy
        sampled), then the new messages and the assistant's opening. None when the template does not
        render the state's conversation as a prefix of the new one."""
        done = render(self.tokenizer, state.messages, tools, generation=False)
        full = render(self.tokenizer, messages, tools, generation=True)
        if not full.startswith(done):
            return None
        closing = self.closing(state.messages, tools)
        sampled_end = self.tokenizer.decode(list(state.tokens[-1:])).strip() if state.ended_with_eos else ""
        if sampled_end and closing.lstrip().startswith(sampled_end):  # the policy wrote it: not context
            closing = closing.lstrip()[len(sampled_end) :]
        return self.encode(closing) + self.encode(full[len(done) :])

    def closing(self, messages: tuple[Message, ...], tools: list[dict[str, Any]] | None) -> str:
        """What the template writes after an assistant message's text (e.g. "<|im_end|>\\n")."""
        probe = messages[:-1] + (Message("assistant", _PROBE),)
        text = render(self.tokenizer, probe, tools, generation=False)
        return text[text.rindex(_PROBE) + len(_PROBE) :] if _PROBE in text else ""


def _extends(messages: tuple[Message, ...], done: tuple[Message, ...]) -> bool:
    """`messages` is `done` (the recorded conversation) followed by at least one more message."""
    return len(messages) > len(done) and all(d.same_turn(m) for d, m in zip(done, messages))
