"""`rlhf serve-rm`: a reward model's scores over HTTP, in the wire format of rlhf/rl/remote_reward.py
(docs/reward_server.md).

An aiohttp server (the `serve` extra) answers GET /health and POST /score. One worker thread scores
every request waiting when it frees up, up to `max_batch_rows` rows, as one batch, laid out and scored
as the trainer does (ids sent with the reward model's own tokenizer fingerprint give the local
numbers). A malformed, too deep, duplicated-key or oversized body gets a 4xx with {"error": why} and
nothing in the server's log. Off loopback every request must carry `Authorization: Bearer TOKEN`
(401 otherwise, compared in constant time); on loopback only when a token is given."""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import os
import queue
import secrets
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlhf.config import ConfigError
from rlhf.config.outside import JSONInputError
from rlhf.config.outside import loads as read_json
from rlhf.models.backbone import model_context
from rlhf.models.device import resolve_device
from rlhf.models.loading import load_tokenizer, prepare_tokenizer
from rlhf.models.precision import Precision
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.rl.experience import Scoring
from rlhf.rl.remote_reward import WIRE_VERSION, tokenizer_fingerprint
from rlhf.rl.roles.frozen import RewardModel

MAX_BODY_MB = 64  # a request body larger than this is refused (HTTP 413; --max-body-mb)
TOKEN_HELP = "docs/reward_server.md#tokens"


class BadRequest(ValueError):
    """A request that does not follow the wire format: answered with HTTP 400 and this message."""


def require_aiohttp():
    """The aiohttp module; exit 2 naming the extra when it is not installed."""
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "rlhf serve-rm needs aiohttp, which is not installed. Fix: pip install 'rlhf[serve]' "
            "(or pip install 'aiohttp>=3.14,<4')."
        ) from None
    return web


@dataclass
class Scorer:
    """A reward model and its tokenizer: rows of a request -> scores."""

    role: RewardModel
    tokenizer: Any
    name: str
    max_rows: int = 4096  # rows one request may hold

    def __post_init__(self) -> None:
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.vocab = len(self.tokenizer)
        self.device = next(self.role.model.parameters()).device
        self.positions = model_context(self.role.model)  # None: the config does not say

    def health(self) -> dict:
        return {
            "status": "ok",
            "wire": WIRE_VERSION,
            "reward_model": self.name,
            "tokenizer": self.fingerprint,
        }

    def rows(self, body: object) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, response ids) of each row of a POST /score body; BadRequest naming the field."""
        if not isinstance(body, dict):
            raise BadRequest('the body must be a JSON object with "prompts" and "responses"')
        if body.get("tokenizer") == self.fingerprint and "prompt_ids" in body:
            prompts = _id_lists(body.get("prompt_ids"), "prompt_ids", self.vocab)
            responses = _id_lists(body.get("response_ids"), "response_ids", self.vocab)
        else:  # another tokenizer's ids, or texts only: the texts, tokenized with ours
            texts = _texts(body.get("prompts"), "prompts"), _texts(body.get("responses"), "responses")
            prompts, responses = ([self._encode(t) for t in group] for group in texts)
        if len(prompts) != len(responses):
            raise BadRequest(
                f"{len(prompts)} prompts but {len(responses)} responses: give one of each per row"
            )
        if len(prompts) > self.max_rows:
            raise BadRequest(f"{len(prompts)} rows in one request, more than this server's {self.max_rows}")
        for i, (ids, response) in enumerate(zip(prompts, responses)):
            if not ids:
                raise BadRequest(f"prompt {i} is empty: a row needs at least one prompt token")
            if self.positions is not None and len(ids) + len(response) > self.positions:
                raise BadRequest(
                    f"row {i} holds {len(ids) + len(response)} tokens, more than the reward model's "
                    f"{self.positions} positions"
                )
        return list(zip(prompts, responses))

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def score(self, rows: list[tuple[list[int], list[int]]]) -> list[float]:
        """Scores of rows laid out as a rollout: the prompts left-padded, the responses right-padded."""
        if not rows:
            return []
        pad = self.tokenizer.pad_token_id
        width_p = max(len(p) for p, _ in rows)
        width_r = max(len(r) for _, r in rows)
        ids = torch.full((len(rows), width_p + width_r), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (prompt, response) in enumerate(rows):
            start = width_p - len(prompt)
            ids[i, start : width_p + len(response)] = torch.tensor(prompt + response, dtype=torch.long)
            mask[i, start : width_p + len(response)] = 1
        sequences = Sequences(ids.to(self.device), mask.to(self.device), width_p)
        return self.role.score(sequences).float().cpu().tolist()


def _texts(value: object, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BadRequest(f'"{field}" must be a list of strings')
    return value


def _id_lists(value: object, field: str, vocab: int) -> list[list[int]]:
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise BadRequest(f'"{field}" must be a list of lists of token ids')
    for i, row in enumerate(value):
        for t in row:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise BadRequest(f'"{field}"[{i}] holds {t!r}, not a token id in [0, {vocab})')
    return value


class Batcher:
    """One worker thread scoring the requests waiting, together, up to `max_rows` rows a batch."""

    def __init__(self, score: Callable[[list], list[float]], max_rows: int):
        self.score_rows = score
        self.max_rows = max_rows
        self.queue: queue.Queue = queue.Queue()
        self.batches = 0  # batches scored (a batch may hold several requests)
        self.requests = 0
        self.thread = threading.Thread(target=self._run, name="rlhf-serve-rm", daemon=True)
        self.thread.start()

    async def score(self, rows: list) -> list[float]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((rows, future, loop))
        return await future

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=30)

    def _take(self) -> list | None:
        """The next batch: the first request waited for, then every one waiting, up to max_rows rows."""
        first = self.queue.get()
        if first is None:
            return None
        batch, rows = [first], len(first[0])
        while rows < self.max_rows:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.queue.put(None)  # closing: after this batch
                break
            batch.append(item)
            rows += len(item[0])
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            try:
                scores = self.score_rows([row for rows, _, _ in batch for row in rows])
                error = None
            except Exception as err:  # noqa: BLE001 (answered to each waiting request as HTTP 500)
                scores, error = [], err
            self.batches += 1
            self.requests += len(batch)
            start = 0
            for rows, future, loop in batch:
                result = scores[start : start + len(rows)]
                start += len(rows)
                try:
                    loop.call_soon_threadsafe(_settle, future, result, error)
                except RuntimeError:  # the server stopped meanwhile: nobody waits for the answer
                    pass


def _settle(future: asyncio.Future, result: list[float], error: BaseException | None) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def build_app(
    scorer: Scorer, batcher: Batcher, *, token: str | None = None, max_body_bytes: int = MAX_BODY_MB * 2**20
):
    """The aiohttp application: GET /health and POST /score; every request carries `token` as
    `Authorization: Bearer TOKEN` when one is given (401 otherwise)."""
    web = require_aiohttp()
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def authorize(request, handler):
        if expected is not None:
            given = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):  # constant time: no timing oracle on the token
                return web.json_response(
                    {"error": "this server requires a bearer token (Authorization: Bearer TOKEN); "
                              f"the request had {'a wrong one' if given else 'none'} ({TOKEN_HELP})"},
                    status=401, headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return await handler(request)

    async def health(request):
        return web.json_response(
            {**scorer.health(), "requests": batcher.requests, "batches": batcher.batches}
        )

    def too_large(size: str):
        return web.json_response(
            {"error": f"the body ({size}) is larger than this server's limit of {max_body_bytes} bytes "
                      "(rlhf serve-rm --max-body-mb): send fewer rows per request (reward.remote.rows_per_request)"},
            status=413)  # fmt: skip

    async def score(request):
        if request.content_length is not None and request.content_length > max_body_bytes:
            return too_large(f"{request.content_length} bytes")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return too_large("over the limit")
        try:
            rows = scorer.rows(read_json(raw))
        except JSONInputError as err:
            return web.json_response({"error": f"the body is not JSON: {err}"}, status=400)
        except BadRequest as err:
            return web.json_response({"error": str(err)}, status=400)
        except Exception as err:  # noqa: BLE001 (whatever the body holds is the client's: never a 500)
            return web.json_response(
                {"error": f"the body does not follow the wire format ({type(err).__name__}: {err})"[:500]},
                status=400,
            )
        try:
            scores = await batcher.score(rows)
        except Exception as err:  # noqa: BLE001 (the model failed: the client hears why)
            return web.json_response({"error": f"scoring failed: {type(err).__name__}: {err}"}, status=500)
        return web.json_response({"scores": scores})

    app = web.Application(client_max_size=max_body_bytes, middlewares=[authorize])
    app.router.add_get("/health", health)
    app.router.add_post("/score", score)
    return app


class RewardServer:
    """`build_app` served on host:port (0: a free port) by an event loop on a thread of its own."""

    def __init__(
        self,
        scorer: Scorer,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_batch_rows: int = 256,
        *,
        token: str | None = None,
        max_body_bytes: int = MAX_BODY_MB * 2**20,
    ):
        self.scorer, self.host = scorer, host
        self.token, self.max_body_bytes = token, max_body_bytes
        self.socket = bind(host, port)
        self.port = self.socket.getsockname()[1]
        self.batcher = Batcher(scorer.score, max_batch_rows)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="rlhf-serve-rm-http", daemon=True)

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the server (127.0.0.0/8, ::1)."""
        return ipaddress.ip_address(self.socket.getsockname()[0].split("%")[0]).is_loopback

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> RewardServer:
        self.thread.start()
        self.ready.wait(timeout=60)
        if self.failure is not None:
            raise self.failure
        return self

    def _serve(self) -> None:
        web = require_aiohttp()
        asyncio.set_event_loop(self.loop)
        app = build_app(self.scorer, self.batcher, token=self.token, max_body_bytes=self.max_body_bytes)
        self.runner = web.AppRunner(app, access_log=None)
        try:
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.SockSite(self.runner, self.socket).start())
        except BaseException as err:  # noqa: BLE001 (re-raised by start() in the caller's thread)
            self.failure = err
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def stop(self) -> None:
        """Stop answering, let the worker finish its batch, close the socket."""
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
        self.batcher.close()
        self.socket.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; ConfigError (exit 2) naming them when that fails."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ConfigError(f"--host {host!r} does not resolve ({err.strerror}). Fix: --host 127.0.0.1 "
                          "(this machine only) or --host 0.0.0.0 (every interface).") from None  # fmt: skip
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        taken = err.errno == errno.EADDRINUSE
        raise ConfigError(
            f"cannot listen on {host}:{port}: {'the port is in use' if taken else err.strerror}. Fix: "
            + (
                "--port another (or 0 for a free one)"
                if taken
                else "--host 127.0.0.1 and a --port above 1023"
            )
            + "."
        ) from None
    sock.setblocking(False)
    return sock


def require_token_off_loopback(server: RewardServer) -> None:
    """A server other machines can reach never runs open: without --token-env it gets a token,
    made here and printed once (stdout), which every request must then send."""
    if server.token is None and not server.loopback:
        server.token = secrets.token_urlsafe(32)
        print(f"token (every request must send `Authorization: Bearer TOKEN`; on the client: export "
              f"RLHF_REWARD_TOKEN=TOKEN, then rlhf train --reward-token-env RLHF_REWARD_TOKEN): {server.token}",
              flush=True)  # fmt: skip


def token_from_env(variable: str) -> str:
    """The bearer token in the environment variable `variable` (--token-env); errors name the
    variable, never a value."""
    token = os.environ.get(variable, "")
    if len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token:
        state = "not set" if variable not in os.environ else "empty" if not token else "not a usable token"
        raise ConfigError(
            f"--token-env {variable}: the environment variable is {state} (a token is 16 or more printable "
            f"ASCII characters, no spaces). Fix: export {variable}=\"$(python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')\", or leave --token-env out off loopback for a token made "
            "and printed at start."
        )
    return token


def load_scorer(
    directory: str, *, device: str = "auto", dtype: str = "auto", micro_batch_size: int = 16
) -> Scorer:
    """The reward model of an `rlhf rm` directory, in `dtype` on `device`, with its own tokenizer."""
    where = resolve_device(device, key="--device")
    precision = Precision.resolve(dtype, where, key="--dtype")
    tokenizer = prepare_tokenizer(load_tokenizer(directory), source=directory)
    model = ScalarHeadModel.from_pretrained(directory, dtype=precision.param_dtype)
    precision.prepare(model)
    role = RewardModel(model, scoring=Scoring(micro_batch_size, precision))
    return Scorer(role, tokenizer, name=str(directory))


def run_serve_rm(args) -> int:
    """Serve until Ctrl-C or SIGTERM (exit 0)."""
    from rlhf.rundir.termination import Terminated

    require_aiohttp()  # before the model loads
    for flag, value, low in (("--port", args.port, 0), ("--batch-size", args.batch_size, 1),
                             ("--max-batch-rows", args.max_batch_rows, 1)):  # fmt: skip
        if value < low or (flag == "--port" and value > 65535):
            raise ConfigError(f"{flag} must be {'in [0, 65535]' if flag == '--port' else '>= 1'}, got {value}. "
                              f"Fix: {flag} {8000 if flag == '--port' else 16}.")  # fmt: skip
    if not args.max_body_mb > 0:
        raise ConfigError(
            f"--max-body-mb must be > 0, got {args.max_body_mb}. Fix: --max-body-mb {MAX_BODY_MB}."
        )
    if not args.reward_model:
        raise ConfigError("missing --reward-model. Fix: pass the --out directory of `rlhf rm`.")
    token = token_from_env(args.token_env) if args.token_env else None  # before the model loads
    scorer = load_scorer(
        args.reward_model, device=args.device, dtype=args.dtype, micro_batch_size=args.batch_size
    )
    server = RewardServer(scorer, args.host, args.port, max_batch_rows=args.max_batch_rows,
                          token=token, max_body_bytes=int(args.max_body_mb * 2**20))  # fmt: skip
    require_token_off_loopback(server)
    server.start()
    print(f"serving the reward model {args.reward_model} on {server.url} (GET /health, POST /score"
          f"{'; bearer token required' if server.token else ''}); Ctrl-C stops", flush=True)  # fmt: skip
    try:
        threading.Event().wait()
    except (KeyboardInterrupt, Terminated):
        print("stopped", file=sys.stderr)
    finally:
        server.stop()
    return 0
