"""A reward from a server over HTTP: `rlhf train --reward-url URL` (`reward.remote`), served by
`rlhf serve-rm` or by any server that speaks the wire format of docs/reward_server.md (version 1:
GET /health, POST /score with the rows as texts and as the policy tokenizer's ids).

The client uses the standard library (http.client; no proxy), retries a refused, reset or timed-out
request and HTTP 429/5xx with exponential backoff, and checks every answer: a score per row, each a
number float32 holds (rlhf/config/outside.py). `reward.remote.timeout` bounds each attempt whole
(connect, send and every read). A bearer token is read from `reward.remote.token_env` when the
client is built and never written anywhere. Whatever fails stops the run with a `RewardServerError`
(exit 2) naming the URL."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import torch

from rlhf.config import ConfigError
from rlhf.config.outside import JSONInputError, outside_number
from rlhf.config.outside import loads as read_json
from rlhf.config.remote import RemoteRewardConfig
from rlhf.models.sampling import Rollout
from rlhf.models.tokenizer_match import tokenizer_signature
from rlhf.rl.episode_record import token_rows

WIRE_VERSION = 1
RETRIED_STATUS = (429, 500, 502, 503, 504)
FIX_DOWN = (
    "start the server (`rlhf serve-rm --reward-model DIR --host HOST --port PORT`, docs/reward_server.md) "
    "and check --reward-url (scheme, host and port); raise --reward.remote.timeout or "
    "--reward.remote.retries for a slow or restarting server"
)


class RewardServerError(ConfigError):
    """The reward server is unreachable or answered something other than one finite score per row."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the tokenizer's signature (vocabulary and special tokens, rlhf/models/tokenizer_match.py):
    equal for two tokenizers that map every token to the same id."""
    signature = json.dumps(tokenizer_signature(tokenizer), sort_keys=True)
    return hashlib.sha256(signature.encode()).hexdigest()


def score_request(tokenizer: Any, rollout: Rollout, fingerprint: str | None = None) -> dict[str, Any]:
    """The POST /score body of a rollout's rows (padding removed; special tokens kept in the texts)."""
    prompt_ids, response_ids = token_rows(rollout)  # an episode's replies included, as the local RM reads it
    return {
        "prompts": tokenizer.batch_decode(prompt_ids, skip_special_tokens=False),
        "responses": tokenizer.batch_decode(response_ids, skip_special_tokens=False),
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "tokenizer": fingerprint or tokenizer_fingerprint(tokenizer),
    }


def check_scores(answer: object, rows: int, url: str) -> torch.Tensor:
    """The scores of an answer to POST /score, [rows] float32; RewardServerError naming `url`, the
    value and the fix unless it is {"scores": [one finite number per row]}."""
    fix = (
        'the server must answer {"scores": [...]} with one finite number per response, in the order '
        "sent (docs/reward_server.md)"
    )
    scores = answer.get("scores") if isinstance(answer, dict) else None
    if not isinstance(scores, list):
        shown = json.dumps(answer)[:200]
        raise RewardServerError(
            f'the reward server {url} answered {shown} without a "scores" list. Fix: {fix}.'
        )
    if len(scores) != rows:
        raise RewardServerError(
            f"the reward server {url} answered {len(scores)} scores for {rows} responses. Fix: {fix}."
        )
    fix += "; a NaN, inf or huge score means the server's model is broken"
    said = f"the reward server {url} answered score"
    checked = [outside_number(v, said, fix, RewardServerError, after=f" for response {i} of {rows}")
               for i, v in enumerate(scores)]  # fmt: skip
    return torch.tensor(checked, dtype=torch.float32)


class JsonClient:
    """JSON over HTTP to one server, the one client of every server a run calls (a reward server, an
    LLM judge): `request(method, path, body)` retried with exponential backoff on what may pass
    (refused, reset, timed out, HTTP 429/5xx), each attempt bounded whole by `timeout`; whatever
    fails raises `error` naming `server` (e.g. "the reward server http://...") and a fix."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        headers: dict[str, str],
        server: str,
        error: type[ConfigError],
        fix_down: str,
        fix_for: Callable[[int], str],
        timeout_key: str,
        wire: str = "docs/reward_server.md",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.wire = wire  # where the server's format is written (for the messages)
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        self.server = f"{server} {self.url}"  # how messages name it
        self.error, self.fix_down, self.fix_for, self.timeout_key = error, fix_down, fix_for, timeout_key
        self.sleep = sleep
        parts = urlsplit(self.url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port
        self.base_path = parts.path.rstrip("/")

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, absent: tuple[int, ...] = ()
    ) -> object:
        """The JSON answer of one request, retried with exponential backoff on what may pass (refused,
        reset, timed out, HTTP 429/5xx); `error` naming the URL otherwise or at the last try. None
        when the server answers a status in `absent` (a path it does not serve, for a probe)."""
        attempts = self.retries + 1
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(attempts):
            try:
                status, raw = self._send(method, path, data)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, bad status line
                failure = _describe(err, self.timeout, self.timeout_key)
            else:
                if status == 200:
                    return self._json(raw, method, path)
                if status in absent:
                    return None
                failure = f"HTTP {status}: {_error_text(raw)}"
                if status not in RETRIED_STATUS:
                    raise self.error(
                        f"{self.server} refused {method} {path} with {failure}. Fix: {self.fix_for(status)}."
                    )
            if attempt + 1 < attempts:
                self.sleep(self.backoff * 2**attempt)
        raise self.error(
            f"{self.server} did not answer {method} {path} after {attempts} attempt"
            f"{'s' if attempts > 1 else ''} ({failure}). Fix: {self.fix_down}."
        )

    def _send(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        """(status, body) of one attempt, within `timeout` seconds in all: a timer shuts the socket
        down at the deadline, which ends whatever read or write is waiting (a socket timeout alone
        bounds each read, and a server sending a byte a second would never time out)."""
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        timeout = self.timeout
        connection = kind(self.host, self.port, timeout=timeout)
        expired = threading.Event()
        # the connected socket, kept: an answer that closes its connection (HTTP/1.0, "Connection:
        # close") takes the socket over and leaves connection.sock None while its body is read
        sockets: list[socket.socket] = []

        def expire() -> None:
            expired.set()
            for sock in (connection.sock, *sockets):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            connection.connect()
            sockets.append(connection.sock)
            if expired.is_set():  # the connect itself took the whole time
                raise TimeoutError
            connection.request(method, self.base_path + path, body=data, headers=self.headers)
            response = connection.getresponse()
            status, body = response.status, response.read()
            if expired.is_set():  # the body may be cut short by the shutdown
                raise TimeoutError
            return status, body
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError from None
            raise
        finally:
            timer.cancel()
            connection.close()

    def _json(self, raw: bytes, method: str, path: str) -> object:
        try:
            return read_json(raw)
        except JSONInputError as err:
            raise self.error(
                f"{self.server} answered {method} {path} with {raw[:200]!r}, not JSON ({err}). Fix: "
                f"answer with a JSON body ({self.wire}), each key once per object."
            ) from None


class RemoteReward:
    """Scores of a reward server for a rollout's responses ([B] float32, on the CPU)."""

    def __init__(
        self,
        settings: RemoteRewardConfig,
        tokenizer: Any,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.url = settings.url.rstrip("/")
        self.tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        headers = {}
        if settings.token_env:
            headers["Authorization"] = f"Bearer {bearer_token(settings.token_env)}"
        self.client = JsonClient(
            self.url,
            timeout=settings.timeout,
            retries=settings.retries,
            backoff=settings.backoff,
            headers=headers,
            server="the reward server",
            error=RewardServerError,
            fix_down=FIX_DOWN,
            fix_for=lambda status: _fix_for(status, settings.token_env),
            timeout_key="reward.remote.timeout",
            sleep=sleep,
        )

    def health(self) -> dict[str, Any]:
        """GET /health (retried as every request); RewardServerError unless the server says "ok"."""
        answer = self.request("GET", "/health")
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise RewardServerError(
                f"the reward server {self.url} answered GET /health with {json.dumps(answer)[:200]}, not "
                f'{{"status": "ok", ...}}. Fix: {FIX_DOWN}.'
            )
        return answer

    def tokenizer_note(self, health: dict[str, Any]) -> str | None:
        """A note when the server's tokenizer is not the policy's: it then scores the texts, re-tokenized."""
        theirs = health.get("tokenizer")
        if theirs == self.fingerprint:
            return None
        which = "reports no tokenizer" if theirs is None else "has a tokenizer other than the policy's"
        return (
            f"the reward server {self.url} {which}: it scores the texts of the prompts and responses, "
            "not the policy's token ids (docs/reward_server.md)"
        )

    def score(self, rollout: Rollout) -> torch.Tensor:
        """[B] scores of the rollout's rows, `rows_per_request` rows per POST /score."""
        body = score_request(self.tokenizer, rollout, self.fingerprint)
        rows = len(body["prompts"])
        step = self.settings.rows_per_request
        parts = []
        for start in range(0, rows, step):
            chunk = {k: v[start : start + step] if isinstance(v, list) else v for k, v in body.items()}
            answer = self.request("POST", "/score", chunk)
            parts.append(check_scores(answer, len(chunk["prompts"]), self.url))
        return torch.cat(parts) if parts else torch.zeros(0)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> object:
        """The JSON answer of one request (JsonClient.request)."""
        return self.client.request(method, path, body)


def bearer_token(
    variable: str,
    key: str = "reward.remote.token_env",
    given: str = "the token `rlhf serve-rm` printed or was given",
    flag: str = "--reward-token-env",
    error: type[ConfigError] = RewardServerError,
    alone: str = "as `rlhf serve-rm` printed it",
) -> str:
    """The token in the environment variable `variable` (named by `key`); the error names the
    variable, never a value."""
    token = os.environ.get(variable, "")
    if not token:
        raise error(
            f"{key} names the environment variable {variable}, which is "
            f"{'empty' if variable in os.environ else 'not set'}. Fix: export {variable}=<{given}>, or "
            f"drop {flag} for a server without a token."
        )
    if any(c in token for c in "\r\n") or not token.isascii():
        raise error(
            f"the token in the environment variable {variable} holds a line break or a non-ASCII "
            f"character. Fix: export the token alone, {alone}."
        )
    return token


def _fix_for(status: int, token_env: str) -> str:
    if status in (404, 405):
        return "serve the wire format of docs/reward_server.md"
    if status in (401, 403):
        if token_env:
            return (f"export {token_env} with the token the server was started with "
                    "(`rlhf serve-rm --token-env NAME`, or the one it printed)")  # fmt: skip
        return "the server requires a token: export it in a variable and pass --reward-token-env NAME"
    return FIX_DOWN


def _describe(err: BaseException, timeout: float, key: str) -> str:
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"no answer within {key} {timeout:g} s"  # the whole request: connect, send, answer
    if isinstance(err, ConnectionRefusedError):
        return "connection refused: nothing listens there"
    if isinstance(err, socket.gaierror):
        return f"the host name does not resolve: {err.strerror or err}"
    return f"{type(err).__name__}: {err}"


def _error_text(raw: bytes) -> str:
    """The server's error message: the "error" of a JSON body, else the body's start."""
    try:
        answer = read_json(raw)
    except JSONInputError:
        return raw[:200].decode(errors="replace") or "(empty body)"
    return str(answer.get("error", answer))[:300] if isinstance(answer, dict) else str(answer)[:300]


def remote_reward(settings: RemoteRewardConfig, tokenizer: Any) -> RemoteReward | None:
    """The client of `reward.remote.url`, or None when it is empty."""
    return RemoteReward(settings, tokenizer) if settings.url else None
