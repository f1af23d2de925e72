"""`--judge-url` from the command line against a loopback OpenAI-schema server: `rlhf train` scored
by the judge alone (the key's variable named in config.yaml, the key nowhere in the run directory),
`rlhf eval`'s position-swapped win rate in eval.json, the summary and report.html, a template
with a bad placeholder as exit 2 naming the file, and the server checked before any model loads
(down, or not serving --judge-model: exit 2 naming the URL and the fix)."""

from __future__ import annotations

import json
import socket

import pytest

from rlhf.cli import main
from rlhf.monitor.run_report import _evaluation
from tests.cli.test_cli import files  # noqa: F401 (the module's fixture of tiny files)
from tests.support.openai_judge import OpenAIJudge, longer_wins

KEY = "sk-test-never-written-42"
TINY_GRPO = [
    "--preset", "grpo", "--train.iterations", "1", "--rollout.batch_size", "2",
    "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "4", "--train.micro_batch_size", "4",
    "--log.sinks", "jsonl",
]  # fmt: skip


@pytest.fixture(scope="module")
def server():
    judge = OpenAIJudge()
    yield judge
    judge.close()


@pytest.mark.slow  # a whole GRPO iteration through the command line
def test_train_scored_by_the_judge_never_writes_the_key(files, server, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("JUDGE_KEY", KEY)
    out = tmp_path / "run"
    args = ["train", "--policy", files["base"], "--prompts", files["prompts"], "--out", str(out),
            "--judge-url", server.url, "--judge-model", "judge-7b", "--judge-key-env", "JUDGE_KEY", *TINY_GRPO]  # fmt: skip
    assert main(args) == 0
    (record,) = [
        json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in x
    ]
    assert record["judge/unparsable"] == 0 and "reward/source/llm_judge" in record
    assert all(r["headers"]["Authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert "key_env: JUDGE_KEY" in (out / "config.yaml").read_text()
    assert not [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def test_eval_by_the_judge_swaps_positions(files, server, tmp_path, capsys):  # noqa: F811
    server.reply, out = longer_wins, tmp_path / "eval.json"
    server.requests.clear()
    args = ["eval", "--policy", files["base"], "--baseline", files["base"], "--prompts", files["test"], "--n", "4",
            "--max-new-tokens", "4", "--out", str(out), "--judge-url", server.url, "--judge-model", "judge-7b"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    llm = result["llm_judge"]
    assert llm["n"] + llm["dropped"] == 4 and llm["replies"] == 8 and llm["unparsable"] == 0
    # one model answers both sides with the same seed: equal answers, ties, a win rate of 1/2
    assert (llm["wins"], llm["ties"], llm["losses"], llm["win_rate"]) == (0, 4, 0, 0.5)
    assert result["judge"] is None and result["samples"][0]["llm_judge_verdict"]["outcome"] == "tie"
    first = result["samples"][0]
    shown = server.contents()  # concurrent requests: in any order
    assert any(
        f"[Response A]\n{first['policy_response']}\n\n[Response B]\n{first['baseline_response']}" in c
        for c in shown
    )
    assert "win rate (ties half)" in capsys.readouterr().out
    assert "<b>LLM judge</b> judge-7b: win rate of the policy" in _evaluation(
        result
    )  # report.html's eval part


def test_a_template_with_a_bad_placeholder_exits_2_naming_the_file(files, server, tmp_path, capsys):  # noqa: F811
    template = tmp_path / "judge.txt"
    template.write_text("Rate {answer} for {prompt}")
    args = ["train", "--policy", files["base"], "--prompts", files["prompts"], "--out", str(tmp_path / "run"),
            "--judge-url", server.url, "--judge-model", "m", "--judge-template", str(template), *TINY_GRPO]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--judge-template {template} holds the placeholder {{answer}}" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_judge_server_is_checked_before_any_model_loads(files, server, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
    train = ["train", "--policy", files["base"], "--prompts", files["prompts"], "--out", str(tmp_path / "run"),
             "--judge-key-env", "JUDGE_KEY", "--reward.llm_judge.retries", "0", *TINY_GRPO]  # fmt: skip
    evaluate = ["eval", "--policy", files["base"], "--baseline", files["base"], "--prompts", files["test"],
                "--out", str(tmp_path / "eval.json"), "--judge-key-env", "JUDGE_KEY", "--llm_judge.retries", "0"]  # fmt: skip
    for command in (train, evaluate):
        assert main([*command, "--judge-url", down, "--judge-model", "judge-7b"]) == 2
        err = capsys.readouterr().err
        assert f"the judge server {down} did not answer GET /models" in err
        assert "Fix: start the server and check --judge-url" in err
        assert main([*command, "--judge-url", server.url, "--judge-model", "judge-70b"]) == 2
        err = capsys.readouterr().err
        assert f"--judge-model 'judge-70b' is not served by the judge server {server.url}" in err
        assert "which lists judge-7b, m" in err and "Traceback" not in err and KEY not in err
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "eval.json").exists()
