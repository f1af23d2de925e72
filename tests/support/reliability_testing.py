"""Helpers of the reliability suite (tests.support.reliability_testing): run `rlhf` in a subprocess
and read what it left behind."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
TINY_TRAIN = [
    "--rollout.batch_size", "4", "--rollout.max_new_tokens", "3", "--train.micro_batch_size", "4",
    "--log.sinks", "jsonl", "--policy_optim.lr", "0.001", "--runtime.overlap_critic", "false",
]  # fmt: skip


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def command(*args) -> list[str]:
    return [sys.executable, "-m", "rlhf.cli", *map(str, args)]


def rlhf(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rlhf ARGS` in a subprocess; stdout and stderr captured as text."""
    return subprocess.run(command(*args), env=env(), capture_output=True, text=True, timeout=timeout)


def rlhf_in_process(capsys, *args) -> subprocess.CompletedProcess:
    """`rlhf ARGS` through `rlhf.cli.main` in this process (for a refusal that ends before any work:
    no interpreter and torch import to pay); the same fields as `rlhf`'s result. An error main()
    does not turn into a message fails the test as a traceback would."""
    from rlhf.cli import main

    capsys.readouterr()  # what came before is not this run's
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(command(*args), code, captured.out, captured.err)


def _default_sigint() -> None:
    # a suite started in the background (`make test &`, nohup, some CI runners) inherits SIGINT
    # ignored, and so would the child: the Ctrl-C tests then time out; give it the default back
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args) -> subprocess.Popen:
    """`rlhf ARGS` started in the background (stdout/stderr piped), with SIGINT's default action
    whatever the test runner's is, so that it can be interrupted as a user would."""
    return subprocess.Popen(
        command(*args),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def train_args(files: dict, out: Path, *extra) -> list:
    return [
        "train", "--preset", "vanilla_ppo", "--policy", files["policy"], "--reward-model", files["rm"],
        "--prompts", files["prompts"], "--out", out, *TINY_TRAIN, *extra,
    ]  # fmt: skip


def assert_user_error(result, *named: str) -> str:
    """Exit code 2, no traceback, one message on stderr naming each of `named`; returns stderr."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for text in named:
        assert text in result.stderr, (text, result.stderr[-3000:])
    return result.stderr


def logged_warnings(caplog) -> list[str]:
    """The warnings `caplog` holds: what a subprocess would also print on stderr (Python's last-resort
    handler), which an in-process run's captured stderr lacks (pytest captures the log)."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def assert_ok(result) -> None:
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def records(run: Path) -> list[dict]:
    """Every record of `run/metrics.jsonl` (each line must be one JSON object)."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def iterations(run: Path) -> list[int]:
    return [r["iteration"] for r in records(run) if "iteration" in r and "event" not in r]


class InProcess:
    """`rlhf.cli.main(ARGS)` in this process (no interpreter start-up): `.returncode` and `.stderr`
    like a finished subprocess, for the cases that need no process of their own."""

    def __init__(self, capsys, *args):
        from rlhf.cli import main

        self.returncode = main([str(a) for a in args])
        captured = capsys.readouterr()
        self.stdout, self.stderr = captured.out, captured.err


def wait_for(condition, timeout: float = 120.0) -> None:
    """Poll `condition()` every 0.2 s until it holds; fail after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def other_tokenizer_reward_model(directory: Path) -> Path:
    """A tiny reward model saved with a tokenizer of the same size as the suite's but other words
    (upper case): every token id means another word to it."""
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

    tok = word_tokenizer([" ".join(w.upper() for w in WORDS)])
    model = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
    ScalarHeadModel.from_causal_lm(model, head_init_std=0.5).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def file_bytes(directory: Path) -> dict[str, bytes]:
    """{relative path: content} of every file under `directory` (byte-identical checks)."""
    root = Path(directory)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
