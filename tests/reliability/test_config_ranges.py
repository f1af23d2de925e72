"""Config validation for every stage: an out-of-range number or a combination that leaves nothing to
train stops before anything is written, with one message naming THAT key and a fix that works."""

from __future__ import annotations

import pytest

from rlhf.cli import main
from tests.support.reliability_testing import assert_ok, assert_user_error, iterations, rlhf, train_args

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
    ("critic.pretrain_patience", "0"),
    ("log.collapse.window", "0"),
]


def _run_in_process(capsys, args) -> str:
    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("key", "value"), SFT_BAD)
def test_sft_ranges(files, tmp_path, capsys, key, value):
    out = tmp_path / "out"
    err = _run_in_process(
        capsys, ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out, f"--{key}", value]
    )
    assert f"{key} must be" in err and "Fix" not in err.split(key)[0]
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize(("key", "value"), RM_BAD)
def test_rm_ranges(files, tmp_path, capsys, key, value):
    out = tmp_path / "out"
    err = _run_in_process(
        capsys, ["rm", "--model", files["policy"], "--data", files["pairs"], "--out", out, f"--{key}", value]
    )
    assert f"{key} must be" in err
    assert not out.exists()


@pytest.mark.parametrize(("key", "value"), RL_BAD)
def test_rl_ranges(files, tmp_path, capsys, key, value):
    out = tmp_path / "out"
    err = _run_in_process(capsys, train_args(files, out, f"--{key}", value))
    assert f"{key} must be" in err
    assert not out.exists()


def test_near_zero_temperature_warns(files, tmp_path, caplog):
    from rlhf.config import RLConfig, load_config

    load_config(RLConfig, overrides={"rollout": {"temperature": 1e-6}})
    assert "rollout.temperature 1e-06 is near 0" in caplog.text and "--rollout.temperature" in caplog.text


@pytest.mark.slow
def test_sft_micro_batch_zero_through_the_cli_and_its_fix(files, tmp_path):
    out = tmp_path / "sft"
    args = ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out, "--sinks", "jsonl",
            "--train.max_steps", "1", "--train.batch_size", "2"]  # fmt: skip
    assert_user_error(rlhf(*args, "--train.micro_batch_size", "0"), "train.micro_batch_size must be >= 1")
    assert not out.exists()
    assert_ok(rlhf(*args, "--train.micro_batch_size", "1"))
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_nothing_to_train_combination_and_its_fix(files, tmp_path):
    out = tmp_path / "rl"
    args = train_args(files, out, "--train.iterations", "1", "--rollout.stop_at_eos", "false")
    refused = rlhf(*args, "--rollout.truncated", "drop")
    assert_user_error(refused, "rollout.stop_at_eos", "rollout.truncated", "--rollout.truncated keep")
    assert not out.exists()
    assert_ok(rlhf(*args, "--rollout.truncated", "keep"))
    assert iterations(out) == [0]
