"""`rlhf serve-rm` and `--reward-url` (docs/reward_server.md): the server started on loopback by the
test scores a rollout as the local reward model does, texts and ids alike; concurrent requests share
batches; malformed requests get HTTP 400; the client retries with backoff and checks every answer,
stopping with a RewardServerError (exit 2) that names the URL."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rlhf.config.remote import RemoteRewardConfig
from rlhf.models.loading import prepare_tokenizer
from rlhf.rl.remote_reward import RemoteReward, RewardServerError, score_request, tokenizer_fingerprint
from rlhf.stages.serve_rm import Batcher, RewardServer, load_scorer
from tests.support.train_testing import rl_config


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, _models, tok):
    """The trainer fixtures' reward model and tokenizer, saved as `rlhf rm` saves them."""
    directory = tmp_path_factory.mktemp("served_rm")
    _models[1].save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def server(rm_dir):
    """`rlhf serve-rm`'s server on 127.0.0.1 and a free port, stopped after the module's tests."""
    running = RewardServer(load_scorer(str(rm_dir), device="cpu", dtype="float32", micro_batch_size=3),
                           "127.0.0.1", 0).start()  # fmt: skip
    yield running
    running.stop()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, path: str, body: object) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def client(url: str, tok, sleeps: list | None = None, **settings) -> RemoteReward:
    sleep = sleeps.append if sleeps is not None else (lambda seconds: None)
    return RemoteReward(RemoteRewardConfig(url=url, **settings), prepare_tokenizer(tok), sleep=sleep)


def test_the_servers_scores_equal_the_local_reward_models(make_trainer, server, tok):
    trainer = make_trainer(rl_config("vanilla_ppo", reward={"remote": {"url": server.url}}))
    rollout = trainer.runtime.generate(trainer.rollouts.draw_prompts()[0], False)
    local = trainer.runtime.forward("reward_model", rollout.sequences)
    assert trainer.scorer.remote is not None
    remote = trainer.scorer.remote.score(rollout)
    assert remote.shape == (8,) and remote.dtype == torch.float32
    torch.testing.assert_close(remote, local.float().cpu(), rtol=0, atol=1e-5)
    # the texts alone, tokenized by the server with its own tokenizer, give the same numbers here
    body = score_request(trainer.runtime.tokenizer, rollout)
    status, answer = post(server.url, "/score", {"prompts": body["prompts"], "responses": body["responses"]})
    assert status == 200
    torch.testing.assert_close(torch.tensor(answer["scores"]), local.float().cpu(), rtol=0, atol=1e-5)


def test_a_run_scored_by_the_server_equals_one_scored_locally(make_trainer, server):
    """The loop's raw scores of one iteration: the server's, and the local reward model's."""
    remote = make_trainer(rl_config("vanilla_ppo", reward={"remote": {"url": server.url}}))
    remote.runtime.roles.reward_model = None  # the server alone scores
    local = make_trainer(rl_config("vanilla_ppo"))
    _, remote_metrics = remote.make_experience()
    _, local_metrics = local.make_experience()
    assert remote_metrics["reward/raw_scores"] == pytest.approx(local_metrics["reward/raw_scores"], abs=1e-5)


def test_health_names_the_model_and_its_tokenizer(server, rm_dir, tok):
    answer = client(server.url, tok).health()
    assert answer["status"] == "ok" and answer["wire"] == 1 and answer["reward_model"] == str(rm_dir)
    assert answer["tokenizer"] == tokenizer_fingerprint(prepare_tokenizer(tok))
    assert client(server.url, tok).tokenizer_note(answer) is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([1, 2], "JSON object"),
        ({"prompts": ["a b"]}, '"responses" must be a list of strings'),
        ({"prompts": ["a", "b"], "responses": ["c"]}, "2 prompts but 1 responses"),
        ({"prompts": [""], "responses": ["c"]}, "prompt 0 is empty"),
        (
            {"prompt_ids": [[1]], "response_ids": [[10**6]], "tokenizer": "SELF"},
            '"response_ids"[0] holds 1000000',
        ),
    ],
)
def test_a_malformed_request_gets_400_naming_the_field(server, body, error, tok):
    if isinstance(body, dict) and body.get("tokenizer") == "SELF":
        body = {**body, "tokenizer": tokenizer_fingerprint(prepare_tokenizer(tok))}
    status, answer = post(server.url, "/score", body)
    assert status == 400 and error in answer["error"]


def test_requests_waiting_together_share_one_batch():
    release, calls = threading.Event(), []

    def score(rows):
        calls.append(len(rows))
        release.wait(timeout=10)
        return [float(sum(p) + sum(r)) for p, r in rows]

    batcher = Batcher(score, max_rows=100)
    try:
        import asyncio

        async def three():
            first = asyncio.ensure_future(batcher.score([([1], [2])]))
            while not calls:  # the worker holds the first request
                await asyncio.sleep(0.01)
            rest = [asyncio.ensure_future(batcher.score([([i], [i])] * 2)) for i in range(2)]
            await asyncio.sleep(0.05)
            release.set()
            return await first, *[await r for r in rest]

        results = asyncio.run(asyncio.wait_for(three(), timeout=20))
    finally:
        release.set()
        batcher.close()
    assert results == ([3.0], [0.0, 0.0], [2.0, 2.0])
    assert calls == [1, 4] and batcher.batches == 2 and batcher.requests == 3


# -- the client against a server that misbehaves -------------------------------------------------


class FakeServer:
    """A stdlib HTTP server on loopback answering GET /health "ok" and POST /score with `answers`
    in turn (status, body), the last one repeated."""

    def __init__(self, answers: list[tuple[int, object]]):
        self.answers, self.calls = list(answers), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: object) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"status": "ok", "wire": 1, "tokenizer": None})

            def do_POST(self):
                rows = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompts"])
                status, body = owner.answers[min(owner.calls, len(owner.answers) - 1)]
                owner.calls += 1
                self._send(status, body(rows) if callable(body) else body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture()
def fake():
    servers: list[FakeServer] = []

    def start(*answers) -> FakeServer:
        servers.append(FakeServer(list(answers)))
        return servers[-1]

    yield start
    for running in servers:
        running.close()


@pytest.fixture()
def rollout(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo"))
    return trainer.runtime.generate(trainer.rollouts.draw_prompts()[0], False)


def test_retries_with_backoff_then_scores(fake, tok, rollout):
    server = fake((503, {"error": "warming up"}), (500, b"oops"), (200, lambda n: {"scores": [0.5] * n}))
    sleeps: list[float] = []
    scores = client(server.url, tok, sleeps, retries=3, backoff=0.25).score(rollout)
    assert scores.tolist() == [0.5] * 8 and server.calls == 3 and sleeps == [0.25, 0.5]


def test_rows_per_request_splits_a_rollout(fake, tok, rollout):
    server = fake((200, lambda n: {"scores": [float(n)] * n}))
    scores = client(server.url, tok, rows_per_request=3).score(rollout)
    assert scores.tolist() == [3.0] * 6 + [2.0] * 2 and server.calls == 3


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda n: {"scores": [1.0] * (n - 1)}, "answered 7 scores for 8 responses"),
        (lambda n: {"scores": [float("nan")] * n}, "answered score nan for response 0 of 8"),
        (lambda n: {"scores": [1.0] * (n - 1) + [None]}, "answered score None for response 7 of 8"),
        (lambda n: {"score": 1}, 'without a "scores" list'),
        (b"<html>", "not JSON"),
    ],
)
def test_a_wrong_answer_names_the_url_and_the_value(fake, tok, rollout, answer, said):
    server = fake((200, answer))
    with pytest.raises(RewardServerError) as raised:
        client(server.url, tok).score(rollout)
    assert server.url in str(raised.value) and said in str(raised.value) and "Fix:" in str(raised.value)
    assert server.calls == 1  # a wrong answer is not retried


def test_a_4xx_is_not_retried_and_its_error_is_shown(fake, tok, rollout):
    server = fake((400, {"error": "prompt 0 is empty"}))
    with pytest.raises(RewardServerError, match=r"refused POST /score with HTTP 400: prompt 0 is empty"):
        client(server.url, tok, retries=3).score(rollout)
    assert server.calls == 1


def test_a_server_that_is_down_is_retried_then_named(tok):
    url = f"http://127.0.0.1:{free_port()}"
    sleeps: list[float] = []
    with pytest.raises(RewardServerError) as raised:
        client(url, tok, sleeps, retries=2, backoff=0.1).health()
    message = str(raised.value)
    assert url in message and "after 3 attempts (connection refused" in message and "rlhf serve-rm" in message
    assert sleeps == [0.1, 0.2]


def test_a_slow_server_times_out(tok):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(
            RewardServerError, match=r"after 1 attempt \(no answer within reward.remote.timeout 0.2 s\)"
        ):
            client(url, tok, retries=0, timeout=0.2).health()
    finally:
        listener.close()


def test_without_aiohttp_the_server_names_the_extra(monkeypatch):
    from rlhf.config import ConfigError
    from rlhf.stages.serve_rm import require_aiohttp

    monkeypatch.setitem(sys.modules, "aiohttp", None)  # an import of it fails
    with pytest.raises(
        ConfigError, match=r"needs aiohttp, which is not installed. Fix: pip install 'rlhf\[serve\]'"
    ):
        require_aiohttp()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("127.0.0.1:8000", "is not an http:// or https:// URL with a host"),
        ("ftp://host:21", "is not an http:// or https:// URL with a host"),
        ("http://host:99999", "is not a URL (Port out of range"),
        ("http://host:8000/?q=1", "has a query or fragment"),
    ],
)
def test_a_url_that_is_not_a_servers_is_refused_naming_it(url, said):
    from rlhf.config import ConfigError

    with pytest.raises(ConfigError) as raised:
        RemoteRewardConfig(url=url).validate("reward.remote.")
    message = str(raised.value)
    assert message.startswith(f"reward.remote.url {url!r} ") and said in message
    assert "Fix: --reward.remote.url http://HOST:PORT" in message


def test_a_reward_function_adds_to_the_servers_score(fake, make_trainer):
    server = fake((200, lambda n: {"scores": [0.5] * n}))
    config = rl_config(
        "vanilla_ppo",
        reward={"remote": {"url": server.url}, "functions": ["tests.support.reward_fns_testing:constant"]},
    )
    trainer = make_trainer(config)
    trainer.runtime.roles.reward_model = None  # the server alone stands for the reward model
    _, metrics = trainer.make_experience()
    assert metrics["reward/raw_scores"] == [0.75] * 8
    assert metrics["reward/part/reward_model"] == 0.5
    assert metrics["reward/part/tests.support.reward_fns_testing:constant"] == 0.25


def test_a_failing_model_answers_500_with_its_error(server, monkeypatch):
    def broken(sequences):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(server.scorer.role, "score", broken)
    status, answer = post(server.url, "/score", {"prompts": ["a b"], "responses": ["c"]})
    assert status == 500 and answer == {"error": "scoring failed: RuntimeError: CUDA out of memory"}
