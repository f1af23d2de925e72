"""`rlhf serve-rm`'s own input (docs/reward_server.md): whatever a request body holds (not JSON,
nested 200,000 deep, a repeated key, wrong types or shapes, too many tokens, too large) gets a 4xx
with {"error": ...} and no traceback in the server's log; a bearer token, when the server has one
(always off loopback), is required of every request (401 without it or with a wrong one), and
`--reward-url`'s client sends it from the environment variable `reward.remote.token_env` names."""

from __future__ import annotations

import http.client
import json
from types import SimpleNamespace

import pytest
import torch

from rlhf.config import ConfigError
from rlhf.config.remote import RemoteRewardConfig
from rlhf.models.tiny import word_tokenizer
from rlhf.rl.remote_reward import RemoteReward, RewardServerError, tokenizer_fingerprint
from rlhf.stages.serve_rm import RewardServer, Scorer, require_token_off_loopback, token_from_env

TOKEN = "t0ken-for-the-tests-only-0123456789"
WORDS = "a b c d e f"


class CountingModel(torch.nn.Module):
    """A stand-in reward model: the score of a row is its number of real tokens (no forward to wait on)."""

    def __init__(self, positions: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(max_position_embeddings=positions)


class CountingRole:
    def __init__(self, positions: int = 12):
        self.model = CountingModel(positions)

    def score(self, sequences) -> torch.Tensor:
        return sequences.attention_mask.sum(-1).float()


def tokenizer():
    tok = word_tokenizer([WORDS])
    tok.pad_token = "<pad>"
    return tok


def start(**options) -> RewardServer:
    return RewardServer(
        Scorer(CountingRole(), tokenizer(), name="counting"), "127.0.0.1", 0, **options
    ).start()


@pytest.fixture(scope="module")
def server():
    running = start(max_body_bytes=500_000)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def guarded():
    running = start(token=TOKEN)
    yield running
    running.stop()


def send(server: RewardServer, method: str, path: str, body: bytes | None = None, **headers: str):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_good_body_is_scored(server):
    status, answer = send(
        server, "POST", "/score", json.dumps({"prompts": ["a b"], "responses": ["c"]}).encode()
    )
    assert (status, answer) == (200, {"scores": [3.0]})


FINGERPRINT = tokenizer_fingerprint(tokenizer())
MALFORMED = {
    "nested 200,000 deep": (b"[" * 200_000 + b"]" * 200_000, 400, "nested too deeply"),
    "not JSON": (b"<html>", 400, "not JSON"),
    "not UTF-8": (b'{"prompts": ["\xff"]}', 400, "not UTF-8"),
    "a repeated key": (b'{"prompts": ["a"], "responses": ["b"], "prompts": ["c"]}', 400, "'prompts' is given twice"),
    "a list": (b"[1, 2]", 400, "JSON object"),
    "prompts a string": (b'{"prompts": "a", "responses": ["b"]}', 400, '"prompts" must be a list of strings'),
    "numbers for texts": (b'{"prompts": [1], "responses": [2]}', 400, '"prompts" must be a list of strings'),
    "one prompt, two responses": (b'{"prompts": ["a"], "responses": ["b", "c"]}', 400, "1 prompts but 2"),
    "an integer of 5000 digits": (b'{"prompts": [' + b"9" * 5000 + b"]}", 400, "cannot be read"),
    "ids out of the vocabulary": (
        json.dumps({"tokenizer": FINGERPRINT, "prompt_ids": [[10**30]], "response_ids": [[1]]}).encode(),
        400, "not a token id"),
    "ids of the wrong shape": (
        json.dumps({"tokenizer": FINGERPRINT, "prompt_ids": [1, 2], "response_ids": [[1]]}).encode(),
        400, "list of lists of token ids"),
    "more tokens than positions": (
        json.dumps({"prompts": ["a b c d e f a b"], "responses": ["a b c d e f"]}).encode(), 400, "12 positions"),
    "larger than the limit": (b'{"prompts": ["' + b"a " * 300_000 + b'"]}', 413, "limit of 500000 bytes"),
}  # fmt: skip


@pytest.mark.parametrize(("body", "status", "said"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_body_gets_a_4xx_naming_why_and_no_traceback(server, capfd, body, status, said):
    got, answer = send(server, "POST", "/score", body)
    assert (got, said in answer["error"]) == (status, True), answer
    assert "Traceback" not in "".join(capfd.readouterr())
    assert send(server, "GET", "/health")[0] == 200  # and the server still answers


def test_a_chunked_body_over_the_limit_gets_413(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        chunks = iter([b'{"prompts": [' + b'"a", ' * 60_000] * 2 + [b'"a"], "responses": ["b"]}'])
        connection.request("POST", "/score", body=chunks, encode_chunked=True)
        response = connection.getresponse()
        assert response.status == 413 and "limit" in json.loads(response.read())["error"]
    finally:
        connection.close()


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"}],
    ids=["none", "wrong", "no scheme", "longer"],
)
def test_a_server_with_a_token_answers_401_without_it(guarded, headers):
    for method, path, body in (
        ("GET", "/health", None),
        ("POST", "/score", b'{"prompts": ["a"], "responses": ["b"]}'),
    ):
        status, answer = send(guarded, method, path, body, **headers)
        assert status == 401 and "bearer token" in answer["error"] and TOKEN not in answer["error"]


def test_the_client_sends_the_token_from_the_variable_named(guarded, monkeypatch):
    monkeypatch.setenv("RLHF_TEST_TOKEN", TOKEN)
    settings = RemoteRewardConfig(url=guarded.url, retries=0, token_env="RLHF_TEST_TOKEN")
    client = RemoteReward(settings, tokenizer())
    assert client.health()["status"] == "ok"
    assert client.request("POST", "/score", {"prompts": ["a"], "responses": ["b c"]}) == {"scores": [3.0]}
    monkeypatch.setenv("RLHF_TEST_TOKEN", "another-token-of-enough-length")
    with pytest.raises(RewardServerError) as raised:
        RemoteReward(settings, tokenizer()).health()
    assert "HTTP 401" in str(raised.value) and "export RLHF_TEST_TOKEN" in str(raised.value)
    assert TOKEN not in str(raised.value) and "another-token" not in str(raised.value)
    with pytest.raises(RewardServerError, match="requires a token: export it"):  # no token_env at all
        RemoteReward(RemoteRewardConfig(url=guarded.url, retries=0), tokenizer()).health()


def test_a_token_variable_that_is_not_set_is_named_never_a_value(monkeypatch):
    monkeypatch.delenv("RLHF_TEST_TOKEN", raising=False)
    with pytest.raises(RewardServerError, match="RLHF_TEST_TOKEN, which is not set"):
        RemoteReward(RemoteRewardConfig(url="http://127.0.0.1:9", token_env="RLHF_TEST_TOKEN"), tokenizer())
    with pytest.raises(ConfigError, match="--token-env RLHF_TEST_TOKEN: the environment variable is not set"):
        token_from_env("RLHF_TEST_TOKEN")
    monkeypatch.setenv("RLHF_TEST_TOKEN", "short")
    with pytest.raises(ConfigError) as raised:
        token_from_env("RLHF_TEST_TOKEN")
    assert "not a usable token" in str(raised.value) and "short" not in str(raised.value).split("Fix")[0]


def test_off_loopback_a_token_is_made_and_printed_once(capsys):
    server = RewardServer(Scorer(CountingRole(), tokenizer(), name="counting"), "0.0.0.0", 0)
    try:
        assert not server.loopback
        require_token_off_loopback(server)
        printed = capsys.readouterr().out
        assert server.token and len(server.token) >= 32 and printed.count(server.token) == 1
    finally:
        server.socket.close()
        server.batcher.close()
    on_loopback = RewardServer(Scorer(CountingRole(), tokenizer(), name="counting"), "127.0.0.1", 0)
    try:
        require_token_off_loopback(on_loopback)
        assert on_loopback.loopback and on_loopback.token is None and capsys.readouterr().out == ""
    finally:
        on_loopback.socket.close()
        on_loopback.batcher.close()


def test_the_token_is_a_name_in_the_config_never_a_value():
    with pytest.raises(ConfigError, match="not the name of an environment variable"):
        RemoteRewardConfig(url="http://127.0.0.1:9", token_env="Bearer abc.def").validate("reward.remote.")
    RemoteRewardConfig(url="http://127.0.0.1:9", token_env="RLHF_REWARD_TOKEN").validate("reward.remote.")
