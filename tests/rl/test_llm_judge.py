"""The LLM judge's client (rlhf/rl/llm_judge.py) against a loopback server speaking the OpenAI
schema: templates checked (a bad placeholder names the file), replies parsed, the reward server's
retries and deadline reused, 4xx/5xx/bad JSON/a foreign answer named, unparsable replies counted,
logged and past the threshold refused naming the URL, the model and a reply; the key only sent."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time

import pytest
import yaml

from rlhf.config import ConfigError
from rlhf.config.judge_template import PAIRWISE_TEMPLATE, POINTWISE_TEMPLATE, load_template
from rlhf.config.llm_judge import LLMJudgeConfig
from rlhf.rl.llm_judge import (
    JudgeServerError,
    LLMJudge,
    parse_score,
    parse_verdict,
    render,
)
from tests.support.openai_judge import OpenAIJudge, length_rater, longer_wins


@pytest.fixture(scope="module")
def server():
    judge = OpenAIJudge()
    yield judge
    judge.close()


@pytest.fixture(autouse=True)
def fresh(server):
    server.reply, server.delay = length_rater, 0.0
    server.failures.clear()
    server.requests.clear()


def client(url: str, mode="pointwise", sleeps: list | None = None, **settings) -> LLMJudge:
    settings = {"model": "judge-7b", "retries": 0, "backoff": 0.0, **settings}
    sleep = (sleeps if sleeps is not None else []).append
    return LLMJudge(LLMJudgeConfig(url=url, **settings), mode, sleep=sleep)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Rating: 7", 7.0),
        ("The answer is fine.\nRating: 8.5", 8.5),
        ("**Score:** 3", 3.0),
        ("Rating: [[6]]", 6.0),
        ("Rating: 2, no wait. Rating: 9", 9.0),  # the last one
        ("  4 ", 4.0),
        ("-1e3", -1000.0),
        ("I cannot rate this.", None),
        ("Rating: high", None),
        ("", None),
    ],
)
def test_a_score_is_read_from_the_reply(reply, score):
    assert parse_score(reply) == score


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Verdict: A", "A"),
        ("B is clearer.\nVerdict: B", "B"),
        ("verdict: TIE", "tie"),
        ("**Verdict:** [[A]]", "A"),
        ("B", "B"),
        ("'tie'.", "tie"),
        ("Both are good", None),
        ("Verdict: C", None),
        ("", None),
    ],
)
def test_a_verdict_is_read_from_the_reply(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_templates_are_checked_naming_the_file(tmp_path):
    assert load_template("", "pointwise") == POINTWISE_TEMPLATE
    assert load_template("", "pairwise") == PAIRWISE_TEMPLATE
    good = tmp_path / "good.txt"
    good.write_text('Judge {prompt} / {response} as JSON {{"score": N}}')
    assert render(load_template(str(good), "pointwise"), prompt="p {x}", response="r") == (
        'Judge p {x} / r as JSON {"score": N}'  # a brace in the filled text stays as it is
    )
    cases = {
        "Rate {answer}": "the placeholder {answer}, which this judge does not fill",
        "Rate {response.__class__}": "the placeholder {response.__class__}",
        "Rate {response!r}": "the placeholder {response!r}",
        "Rate {response:>9}": "the placeholder {response:>9}",
        "Rate {prompt} {": "Single '{' encountered",
        "Rate {prompt}": "has no {response}",
    }
    for i, (text, said) in enumerate(cases.items()):
        path = tmp_path / f"t{i}.txt"
        path.write_text(text)
        with pytest.raises(ConfigError) as raised:
            load_template(str(path), "pointwise")
        assert said in str(raised.value) and str(path) in str(raised.value) and "Fix:" in str(raised.value)
    pairwise = tmp_path / "pair.txt"
    pairwise.write_text("{prompt} {response}")  # a pointwise template given to eval
    with pytest.raises(ConfigError, match=r"placeholder \{response\}.*pairwise"):
        load_template(str(pairwise), "pairwise")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_template(str(tmp_path / "missing.txt"), "pointwise")


def test_scores_come_back_in_order_from_concurrent_requests(server):
    responses = [" ".join(["w"] * k) for k in range(1, 11)]
    judge = client(server.url, concurrency=4)
    assert judge.scores(["p"] * 10, responses) == [float(k) for k in range(1, 11)]
    body = server.requests[0]["body"]
    assert body["model"] == "judge-7b" and body["temperature"] == 0.0 and body["max_tokens"] == 512
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert "[Response]\nw w w" in "".join(server.contents())
    assert judge.unparsable == 0 and judge.replies == 10


def test_the_key_is_sent_from_the_variable_and_never_written(server, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret-123")
    settings = LLMJudgeConfig(url=server.url, model="m", key_env="JUDGE_TEST_KEY", retries=0)
    server.reply = lambda content: "no rating here"
    with caplog.at_level(logging.WARNING, logger="rlhf.llm_judge"):
        with pytest.raises(JudgeServerError) as raised:
            LLMJudge(settings, "pointwise").scores(["p"], ["r"])
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-secret-123"
    written = yaml.safe_dump(dataclasses.asdict(settings))
    assert "JUDGE_TEST_KEY" in written and "sk-secret" not in written
    assert "sk-secret" not in str(raised.value) and "sk-secret" not in caplog.text
    monkeypatch.delenv("JUDGE_TEST_KEY")
    with pytest.raises(JudgeServerError, match="JUDGE_TEST_KEY, which is not set"):
        LLMJudge(settings, "pointwise")
    with pytest.raises(ConfigError, match="not the name of an environment variable") as raised:
        dataclasses.replace(settings, key_env="sk-secret-123").validate("reward.llm_judge.")
    assert "sk-secret" not in str(raised.value)


def test_5xx_and_429_are_retried_with_backoff_4xx_is_not(server):
    sleeps: list[float] = []
    server.failures[:] = [(503, b'{"error": "loading"}'), (429, b'{"error": "busy"}')]
    assert client(server.url, sleeps=sleeps, retries=2, backoff=0.5, concurrency=1).scores(
        ["p"], ["a b"]
    ) == [2.0]
    assert sleeps == [0.5, 1.0] and len(server.requests) == 3
    server.failures[:] = [(404, b'{"error": "model not found"}')]
    with pytest.raises(JudgeServerError) as raised:
        client(server.url, retries=3).scores(["p"], ["a"])
    said = str(raised.value)
    assert "HTTP 404: model not found" in said and server.url in said and "base URL" in said
    assert len(server.requests) == 4  # not retried
    server.failures[:] = [(401, b'{"error": "no key"}')]
    with pytest.raises(JudgeServerError, match="--judge-key-env NAME"):
        client(server.url).scores(["p"], ["a"])


def test_a_slow_server_times_out_naming_the_key(server):
    server.delay = 1.0
    start = time.monotonic()
    with pytest.raises(JudgeServerError) as raised:
        client(server.url, timeout=0.2, retries=1).scores(["p"], ["a"])
    assert time.monotonic() - start < 0.9  # two attempts of 0.2 s
    said = str(raised.value)
    assert "no answer within reward.llm_judge.timeout 0.2 s" in said and "after 2 attempts" in said


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"<html>oops</html>", "not JSON"),
        (b'{"choices": [{"message": {"content": 3}}]}', "not a chat completion"),
        (b'{"result": "Rating: 3"}', "not a chat completion"),
    ],
)
def test_an_answer_outside_the_schema_is_named(server, answer, said):
    server.failures[:] = [(200, answer)]
    with pytest.raises(JudgeServerError) as raised:
        client(server.url).scores(["p"], ["a"])
    assert said in str(raised.value) and server.url in str(raised.value)


def test_unparsable_replies_are_counted_logged_and_refused_past_the_threshold(server, caplog):
    server.reply = lambda content: "Verdict: A" if "GOOD" in content else "I prefer neither."
    judge = client(server.url, "pairwise", max_unparsable=0.5)
    with caplog.at_level(logging.WARNING, logger="rlhf.llm_judge"):
        got = judge.verdicts(["p"] * 4, ["GOOD", "GOOD", "two", "three"], ["x"] * 4)
    assert got == ["A", "A", None, None]  # 2 of 4: at the threshold, dropped by the caller
    assert judge.unparsable == 2 and judge.replies == 4
    assert (
        caplog.text.count("gave a reply without a verdict (dropped)") == 2
        and "I prefer neither." in caplog.text
    )
    with pytest.raises(JudgeServerError) as raised:
        judge.verdicts(["p"] * 3, ["GOOD", "two", "three"], ["x"] * 3, where="LLM judge, prompts 1-3: ")
    said = str(raised.value)
    assert said.startswith("LLM judge, prompts 1-3: 2 of 3 replies of the judge server " + server.url)
    assert "(model judge-7b)" in said and '"I prefer neither."' in said and "max_unparsable 0.5" in said
    assert caplog.text.count("without a verdict") == 3  # the first few only


def test_the_pairwise_template_shows_both_answers(server):
    server.reply = longer_wins
    judge = client(server.url, "pairwise")
    assert judge.verdicts(["p", "p", "p"], ["long answer", "a", "same"], ["short", "longer", "same"]) == [
        "A",
        "B",
        "tie",
    ]


def test_the_server_check_reads_the_model_list(server, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret-123")
    client(server.url).check_server()  # judge-7b is listed: one GET, nothing asked
    assert [(r["path"], r["body"]) for r in server.requests] == [("/v1/models", None)]
    with pytest.raises(JudgeServerError) as raised:
        client(server.url, model="judge-70b", key_env="JUDGE_TEST_KEY").check_server()
    said = str(raised.value)
    assert "--judge-model 'judge-70b' is not served by the judge server " + server.url in said
    assert "lists judge-7b, m (GET /models)" in said and "Fix: --judge-model judge-7b" in said
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in said


def test_a_server_without_a_model_list_answers_one_short_completion(server):
    server.models, server.reply = None, lambda content: "OK"
    try:
        client(server.url).check_server()
        get, post = server.requests
        assert get["path"] == "/v1/models" and post["path"] == "/v1/chat/completions"
        assert post["body"]["max_tokens"] == 1 and post["body"]["model"] == "judge-7b"
        server.failures[:] = [(404, b'{"error": "no"}'), (404, b'{"error": "not found"}')]
        with pytest.raises(JudgeServerError, match=r"refused POST /chat/completions with HTTP 404.*base URL"):
            client(server.url).check_server()
    finally:
        server.models = ("judge-7b", "m")


def test_a_server_down_or_off_schema_is_named_by_the_check(server):
    server.failures[:] = [(200, b'{"models": ["judge-7b"]}')]
    with pytest.raises(JudgeServerError, match=r"answered GET /models with .* not a model list"):
        client(server.url).check_server()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
    with pytest.raises(JudgeServerError) as raised:
        client(down, retries=1).check_server()
    said = str(raised.value)
    assert f"the judge server {down} did not answer GET /models after 2 attempts" in said
    assert "Fix: start the server and check --judge-url" in said
