"""Config validation for every stage: an out-of-range number or a combination that leaves nothing to
train stops before anything is written, with one message naming THAT key and a fix that works."""

from __future__ import annotations

import pytest

from rlhf.cli import main
from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    iterations,
    train_args,
)

SFT_BAD = [
    ("train.micro_batch_size", "0"),
    ("train.batch_size", "0"),
    ("train.log_every", "0"),
    ("train.epochs", "0"),
    ("train.max_steps", "0"),
    ("data.test_fraction", "1.0"),
    ("data.max_response_tokens", "0"),
    ("optim.lr", "0"),
    ("optim.warmup_steps", "-1"),
]
RM_BAD = [("train.max_tokens", "0"), ("train.lm_coef", "-1"), ("train.batch_size", "0")]
RL_BAD = [
    ("train.iterations", "-3"),
    ("rollout.batch_size", "0"),
    ("log.every", "0"),
    ("checkpoint.keep", "0"),
    ("checkpoint.every", "-1"),
    ("rollout.top_k", "-1"),
    ("policy_optim.lr", "0"),
    ("critic.pretrain_iterations", "-1"),
    ("log.collapse.window", "0"),
]


def refusals(capsys, tmp_path, bad: list[tuple[str, str]], command) -> list[str]:
    """Each (key, value) of `bad` run through `command(out, flag, value)` in-process: the keys whose
    run was not refused with exit 2, one message "command line: KEY must be ..." naming the value and
    a fix, and nothing written."""
    failed = []
    for key, value in bad:
        out = tmp_path / key
        code = main([str(a) for a in command(out, f"--{key}", value)])
        err = capsys.readouterr().err
        message = err.split(": ", 1)[-1]
        ok = code == 2 and "Traceback" not in err and message.startswith(f"command line: {key} must be")
        ok = ok and f"got {value}" in message and "Fix: --" in message and not out.exists()
        if not ok:
            failed.append(f"{key} {value}: exit {code}: {err.strip()}")
    return failed


def test_sft_ranges(files, tmp_path, capsys):
    def sft(out, *flag):
        return ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out, *flag]

    assert refusals(capsys, tmp_path, SFT_BAD, sft) == []


def test_rm_ranges(files, tmp_path, capsys):
    def rm(out, *flag):
        return ["rm", "--model", files["policy"], "--data", files["pairs"], "--out", out, "--train.batching",
                "tokens", *flag]  # fmt: skip

    assert refusals(capsys, tmp_path, RM_BAD, rm) == []


def test_rl_ranges(files, tmp_path, capsys):
    assert refusals(capsys, tmp_path, RL_BAD, lambda out, *flag: train_args(files, out, *flag)) == []


def test_near_zero_temperature_warns(files, tmp_path, caplog):
    from rlhf.config import RLConfig, load_config

    load_config(RLConfig, overrides={"rollout": {"temperature": 1e-6}})
    assert "rollout.temperature 1e-06 is near 0" in caplog.text and "--rollout.temperature" in caplog.text


@pytest.mark.slow
def test_sft_micro_batch_zero_through_the_cli_and_its_fix(files, tmp_path, capsys):
    out = tmp_path / "sft"
    args = ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out, "--sinks", "jsonl",
            "--train.max_steps", "1", "--train.batch_size", "2"]  # fmt: skip
    refused = InProcess(capsys, *args, "--train.micro_batch_size", "0")
    assert_user_error(refused, "train.micro_batch_size must be >= 1")
    assert not out.exists()
    assert_ok(InProcess(capsys, *args, "--train.micro_batch_size", "1"))  # the fix
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_nothing_to_train_combination_and_its_fix(files, tmp_path, capsys):
    out = tmp_path / "rl"
    args = train_args(files, out, "--train.iterations", "1", "--rollout.stop_at_eos", "false")
    refused = InProcess(capsys, *args, "--rollout.truncated", "drop")
    assert_user_error(refused, "rollout.stop_at_eos", "rollout.truncated", "--rollout.truncated keep")
    assert not out.exists()
    assert_ok(InProcess(capsys, *args, "--rollout.truncated", "keep"))
    assert iterations(out) == [0]
