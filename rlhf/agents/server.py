"""An OpenAI-compatible chat server over the policy's sampler, on a loopback address
(127.0.0.1, an ephemeral port), the standard library's threading HTTP server.

    POST {base}/chat/completions   messages, tools, temperature, top_p, max_tokens, stop, n, logprobs
    GET  {base}/models             the one model

`base` is `/e/{episode}/v1` for an episode of a training batch (its requests are recorded,
rlhf/agents/trajectory.py) or `/v1` (answered, nothing recorded). Non-streaming only; `stream: true`
and any field of the wrong type get a 400. Every request is sampled through the batcher
(rlhf/agents/batcher.py), together with the other episodes' requests."""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlhf.agents.batcher import Batcher, Sampled, Sampling
from rlhf.agents.chat import Message, RequestError, ToolCall, normalize_messages, parse_tool_calls
from rlhf.agents.trajectory import Prepared, Trajectory
from rlhf.config.outside import JSONInputError
from rlhf.config.outside import loads as read_json

# one answer: (content, tool calls, finish_reason, the tokens' log-probs for `logprobs: true`)
Choice = tuple[str, tuple[ToolCall, ...], str, list[dict[str, Any]] | None]


@dataclass
class Episode:
    """One episode's record and limits; `closed`: its requests are refused (it ended or timed out)."""

    trajectory: Trajectory
    max_turns: int
    max_tokens: int  # response-block tokens at most (turns and context)
    closed: bool = False
    limited: int = 0  # requests answered empty at a limit
    errors: int = 0  # requests refused (400/410)
    ids: int = 0


@dataclass
class Settings:
    """What every request shares: the policy's name, the per-turn token limit, the stop ids."""

    model: str
    max_new_tokens: int
    max_context: int | None = None  # tokens a request's context may take (the policy's positions less a turn)
    request_timeout_s: float = 600.0
    episodes: dict[str, Episode] = field(default_factory=dict)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # the listen backlog: every running episode may connect at once (the standard library's 5
    # refuses connections when a batch of episodes starts on a busy machine)
    request_queue_size = 1024


class ChatServer:
    """The server, started on construction (a daemon thread); `close()` stops it."""

    def __init__(self, tokenizer: Any, batcher: Batcher, settings: Settings) -> None:
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.settings = settings
        self.lock = threading.Lock()
        # the handler threads take turns with the tokenizer: a fast tokenizer shared between threads
        # may refuse a call while another one holds it ("Already borrowed")
        self.tokenizing = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the trainer logs
                pass

            def do_GET(self) -> None:
                self.answer(*server.get(self.path))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.answer(*server.post(self.path, self.rfile.read(length)))

            def answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = _HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, name="rlhf-agent-server", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address
        return f"http://{host}:{port}"

    def open_episode(self, max_turns: int, max_tokens: int) -> tuple[str, Episode]:
        """A new episode: (its base URL, its record)."""
        key = uuid.uuid4().hex[:16]
        episode = Episode(Trajectory(self.tokenizer), max_turns, max_tokens)
        with self.lock:
            self.settings.episodes[key] = episode
        return f"{self.url}/e/{key}/v1", episode

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    # -- routes ---------------------------------------------------------------------------------
    def route(self, path: str) -> tuple[Episode | None, str]:
        """(the episode of `/e/{key}/v1/...`, or None for `/v1/...`; the rest of the path)."""
        path = path.split("?", 1)[0].rstrip("/")
        if path.startswith("/e/"):
            key, _, rest = path[3:].partition("/")
            with self.lock:
                episode = self.settings.episodes.get(key)
            if episode is None:
                raise LookupError(f"no episode {key!r} on this server")
            return episode, "/" + rest
        return None, path

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            _, rest = self.route(path)
        except LookupError as err:
            return error(404, str(err))
        if rest == "/v1/models":
            model = {"id": self.settings.model, "object": "model", "created": 0, "owned_by": "rlhf"}
            return 200, {"object": "list", "data": [model]}
        return error(
            404, f"no route GET {path}; the server answers POST /v1/chat/completions, GET /v1/models"
        )

    def post(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        try:
            episode, rest = self.route(path)
        except LookupError as err:
            return error(404, str(err))
        if rest != "/v1/chat/completions":
            return error(404, f"no route POST {path}; the server answers POST /v1/chat/completions")
        if episode is not None and episode.closed:
            episode.errors += 1
            return error(410, "this episode is over (it ended, or ran past agent.timeout_s)")
        try:
            body = read_json(raw or b"{}")  # a repeated key or a 200,000-deep nesting: a 400 too
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return 200, self.complete(body, episode)
        except (RequestError, JSONInputError) as err:
            if episode is not None:
                episode.errors += 1
            return error(400, str(err))
        except Exception as err:  # the sampler's failure, already raised on the trainer's thread
            if episode is not None:
                episode.errors += 1
            return error(500, str(err))

    # -- chat completions -----------------------------------------------------------------------
    def complete(self, body: dict[str, Any], episode: Episode | None) -> dict[str, Any]:
        if body.get("stream"):
            raise RequestError("stream: true is not supported; the server answers whole completions")
        messages = normalize_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise RequestError("tools must be a list of {type: function, function: {...}} objects")
        n = _integer(body, "n", 1, low=1) or 1
        max_tokens = _integer(body, "max_tokens", None, low=1) or _integer(
            body, "max_completion_tokens", None, low=1
        )
        sampling = Sampling(_number(body, "temperature", 1.0, low=0.0), _number(body, "top_p", 1.0, low=0.0))
        if not 0 < sampling.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {sampling.top_p}")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
            raise RequestError("stop must be a string or a list of non-empty strings")
        tools_key = json.dumps(tools, sort_keys=True) if tools else ""
        trajectory = episode.trajectory if episode is not None else Trajectory(self.tokenizer)
        with self.tokenizing:
            prepared = trajectory.prepare(messages, tools, tools_key)
        budget = (
            self.settings.max_new_tokens
            if max_tokens is None
            else min(max_tokens, self.settings.max_new_tokens)
        )
        too_long = self.settings.max_context is not None and len(prepared.context) > self.settings.max_context
        if episode is not None:
            used = len(prepared.context) - len(prepared.base.prompt) if prepared.base else 0
            budget = min(budget, episode.max_tokens - used)
            if trajectory.turns >= episode.max_turns or budget < 1 or too_long:
                episode.limited += 1  # the episode's limits: an empty answer, nothing recorded
                return self.response(body, [("", (), "length", None)])
        elif too_long:
            raise RequestError(
                f"the messages take {len(prepared.context)} tokens; the policy reads {self.settings.max_context} "
                "before its answer"
            )
        futures = [self.batcher.submit(prepared.context, sampling, budget) for _ in range(n)]
        choices = []
        for i, future in enumerate(futures):
            sampled: Sampled = future.result(timeout=self.settings.request_timeout_s)
            with self.tokenizing:
                choices.append(self.answer(sampled, prepared, trajectory, stop, bool(tools), first=i == 0))
        return self.response(body, choices)

    def answer(self, sampled: Sampled, prepared: Prepared, trajectory: Trajectory, stop: list[str],
               tools: bool, *, first: bool) -> Choice:  # fmt: skip
        """One choice: (content, tool calls, finish_reason, logprobs), its turn recorded."""
        tokens, logprobs, ended = sampled.tokens, sampled.logprobs, sampled.ended_with_eos
        body_tokens = tokens[:-1] if ended else tokens
        text = self.tokenizer.decode(body_tokens, skip_special_tokens=True)
        finish = "stop" if ended else "length"
        cut = _stop_at(self.tokenizer, body_tokens, stop) if stop else None
        if cut is not None:  # the turn ends at the stop string: the tokens after it were never sent
            keep, text = cut
            tokens, logprobs, ended, finish = tokens[:keep], logprobs[:keep], False, "stop"
        content, calls = parse_tool_calls(text) if tools else (text, ())
        if calls:
            finish = "tool_calls"
        state = trajectory.record(prepared, tokens, logprobs, ended, Message("assistant", content, calls))
        if first:
            trajectory.answered(state, len(calls))
        pieces = [self.tokenizer.decode([t]) for t in tokens]
        token_logprobs = [
            {"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
            for p, lp in zip(pieces, logprobs)
        ]
        return content, calls, finish, token_logprobs

    def response(self, body: dict[str, Any], choices: list[Choice]) -> dict[str, Any]:
        out = []
        for i, (content, calls, finish, token_logprobs) in enumerate(choices):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content if content or not calls else None,
            }
            if calls:
                message["tool_calls"] = [c.openai(f"call_{uuid.uuid4().hex[:12]}") for c in calls]
            choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish}
            choice["logprobs"] = (
                {"content": token_logprobs} if body.get("logprobs") and token_logprobs else None
            )
            out.append(choice)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.settings.model,
            "choices": out,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


def error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _number(body: dict[str, Any], key: str, default: float, *, low: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < low
    ):
        raise RequestError(f"{key} must be a number >= {low}, got {value!r}")
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int | None, *, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{key} must be an integer >= {low}, got {value!r}")
    return value


def _stop_at(tokenizer: Any, tokens: list[int], stop: list[str]) -> tuple[int, str] | None:
    """(the tokens up to the one that completes the first stop string, the text before that string),
    or None when no stop string is written."""
    for k in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        hits = [text.index(s) for s in stop if s in text]
        if hits:
            return k, text[: min(hits)]
    return None
