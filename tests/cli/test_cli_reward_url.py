"""`rlhf train --reward-url` and `rlhf serve-rm` from the command line (docs/reward_server.md): a run
scored by a reward server started on loopback equals the run scored by the same reward model locally;
a server that is down, answers the wrong number of scores or a NaN stops the run with exit 2 and a
message naming the URL; `rlhf serve-rm` serves until Ctrl-C."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

from rlhf.cli import main
from rlhf.stages.serve_rm import RewardServer, load_scorer
from tests.cli.test_cli import files, write_jsonl  # noqa: F401 (the module's fixture of tiny files)
from tests.stages.test_serve_rm import FakeServer, free_port, post
from tests.support.reliability_testing import start

TINY_GRPO = [
    "--preset", "grpo", "--train.iterations", "1", "--rollout.batch_size", "3",
    "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "4", "--train.micro_batch_size", "6",
    "--policy_optim.lr", "0.001", "--log.sinks", "jsonl",
]  # fmt: skip
REMOTE = ["--reward.remote.retries", "1", "--reward.remote.backoff", "0"]  # with --reward-url only


@pytest.fixture(scope="module")
def models(files):  # noqa: F811
    """An SFT policy and a reward model trained from it (one step each)."""
    root = Path(files["root"])
    short = [
        "--train.max_steps",
        "1",
        "--train.batch_size",
        "4",
        "--data.test_fraction",
        "0.25",
        "--sinks",
        "jsonl",
    ]
    assert (
        main(
            ["sft", "--model", files["base"], "--data", files["sft"], "--out", str(root / "url_sft"), *short]
        )
        == 0
    )
    assert main(["rm", "--model", str(root / "url_sft"), "--data", files["pairs"], "--out", str(root / "url_rm"),
                 *short]) == 0  # fmt: skip
    return str(root / "url_sft"), str(root / "url_rm")


def train(models, files, out: Path, *source: str) -> int:  # noqa: F811
    return main(
        [
            "train",
            "--policy",
            models[0],
            "--prompts",
            files["prompts"],
            "--out",
            str(out),
            *source,
            *TINY_GRPO,
            *(REMOTE if "--reward-url" in source else []),
        ]
    )


def raw_scores(out: Path) -> list[float]:
    (record,) = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line
    ]
    return record["reward/raw_scores"]


@pytest.mark.slow  # two runs and a server: ~6 s
def test_a_run_scored_by_the_server_equals_the_local_run(models, files, tmp_path):  # noqa: F811
    server = RewardServer(load_scorer(models[1], device="cpu", dtype="float32"), "127.0.0.1", 0).start()
    try:
        assert train(models, files, tmp_path / "remote", "--reward-url", server.url) == 0
        assert server.batcher.requests == 1  # one rollout, one request
    finally:
        server.stop()
    assert train(models, files, tmp_path / "local", "--reward-model", models[1]) == 0
    assert raw_scores(tmp_path / "remote") == pytest.approx(raw_scores(tmp_path / "local"), abs=1e-5)
    assert f"url: {server.url}" in (tmp_path / "remote" / "config.yaml").read_text()


def test_a_server_that_is_down_exits_2_naming_the_url(models, files, tmp_path, capsys):  # noqa: F811
    url = f"http://127.0.0.1:{free_port()}"
    assert train(models, files, tmp_path / "run", "--reward-url", url) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlhf train: the reward server {url} did not answer GET /health after 2 attempts")
    assert "connection refused" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before any model loaded


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda n: {"scores": [0.0] * (n + 1)}, "answered 7 scores for 6 responses"),
        (b'{"scores": [NaN, 0, 0, 0, 0, 0]}', "answered score nan for response 0 of 6, not a finite number"),
    ],
)
def test_a_wrong_answer_exits_2_naming_the_url(models, files, tmp_path, capsys, answer, said):  # noqa: F811
    server = FakeServer([(200, answer)])
    try:
        assert train(models, files, tmp_path / "run", "--reward-url", server.url) == 2
    finally:
        server.close()
    note, err = capsys.readouterr().err.splitlines()
    assert (
        note == f"note: the reward server {server.url} reports no tokenizer: it scores the texts of the "
        "prompts and responses, not the policy's token ids (docs/reward_server.md)"
    )
    assert err.startswith(f"rlhf train: the reward server {server.url} {said}") and "Traceback" not in err


def test_a_bad_url_or_two_sources_exit_2(models, files, tmp_path, capsys):  # noqa: F811
    assert train(models, files, tmp_path / "a", "--reward-url", "127.0.0.1:8000") == 2
    assert "reward.remote.url '127.0.0.1:8000' is not an http:// or https:// URL" in capsys.readouterr().err
    assert (
        train(
            models, files, tmp_path / "b", "--reward-url", "http://127.0.0.1:1", "--reward-model", models[1]
        )
        == 2
    )
    assert "pass one of --reward-model and --reward-url" in capsys.readouterr().err


def test_serve_rm_refuses_a_port_in_use(models, capsys):
    server = FakeServer([(200, {})])
    try:
        port = server.url.rsplit(":", 1)[1]
        assert main(["serve-rm", "--reward-model", models[1], "--port", port]) == 2
    finally:
        server.close()
    assert (
        f"cannot listen on 127.0.0.1:{port}: the port is in use. Fix: --port another"
        in capsys.readouterr().err
    )


@pytest.mark.slow  # a process of its own: imports and the model load, ~5 s
def test_serve_rm_serves_until_ctrl_c(models):
    process = start("serve-rm", "--reward-model", models[1], "--port", "0", "--device", "cpu")
    watchdog = threading.Timer(120, process.kill)  # the test ends whatever the process does
    watchdog.start()
    try:
        line = process.stdout.readline()  # blocks until the server listens (or the process ends)
        assert line.startswith(f"serving the reward model {models[1]} on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        status, answer = post(url, "/score", {"prompts": ["a b"], "responses": ["c d"]})
        assert status == 200 and len(answer["scores"]) == 1
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
