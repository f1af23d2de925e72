"""Every mistake a user can make ends at the start with one message (exit 2, the key, the
value, the fix), nothing of the user's is written over, and a resume never rewrites the past."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rlhf.config import ConfigError, RLConfig, load_config
from rlhf.ray_runtime.machine_fit import fit_ray_to_machine
from rlhf.rundir.preflight import check_input_file, check_ray_address
from rlhf.stages.result_files import refuse_foreign_file, write_result
from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    file_bytes,
    iterations,
    rlhf,
    train_args,
)


def eval_args(files, *extra) -> list:
    return [
        "eval", "--policy", files["policy"], "--baseline", files["policy"], "--judge", files["rm"],
        "--prompts", files["prompts"], *extra,
    ]  # fmt: skip


# -- one meaning per flag --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, named",
    [
        (["sft", "--model", "M", "--data", "A.jsonl", "--data.path", "B.jsonl"], ("--data", "--data.path")),
        (["train", "--policy", "P", "--model.policy", "Q", "--reward-model", "R", "--prompts", "X"],
         ("--policy", "--model.policy")),
        (["rm-eval", "--reward-model", "R", "--data", "D", "--n", "3", "--n", "3", "--batch_size", "4",
          "--batch-size", "5"], ("--batch-size",)),
    ],
)  # fmt: skip
def test_a_flag_and_its_dotted_key_with_two_values_is_refused(capsys, args, named):
    result = InProcess(capsys, *args)
    assert_user_error(result, *named, "Fix: give only one of them")


def test_n_zero_means_the_same_in_eval_and_rm_eval(files, capsys):
    for args in (
        eval_args(files, "--n", "0"),
        ["rm-eval", "--reward-model", files["rm"], "--data", "D", "--n", "0"],
    ):
        stderr = assert_user_error(InProcess(capsys, *args), "n must be >= 1", "got 0")
    assert "leave it out to score every pair" in stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["plan", "--model", "7b", "--gpu-memory", "80"],
            "'80' has no unit (GB? bytes?). Fix: --gpu-memory 80GB",
        ),
        (["demo", "--seeds", "0"], "--seeds: must be >= 1, got 0"),
        (["plan", "--model", "7b", "--gpus", "0"], "--gpus: must be >= 1, got 0"),
    ],
)
def test_a_count_or_size_that_means_nothing_is_refused(capsys, args, says):
    with pytest.raises(SystemExit) as stop:
        InProcess(capsys, *args)
    assert stop.value.code == 2 and says in capsys.readouterr().err


# -- --out holds nothing of the user's -------------------------------------------------------------
def test_out_of_another_model_or_a_project_folder_is_refused_untouched(files, tmp_path, capsys):
    model = tmp_path / "other_model"
    shutil.copytree(files["rm"], model)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "config.yaml").write_text("train:\n  max_steps: 1\n")
    (project / "report.html").write_text("<p>mine</p>\n")
    before = {p: file_bytes(p) for p in (model, project)}
    cases = [
        (["dpo", "--model", files["policy"], "--data", files["pairs"], "--out", model], "is a model directory"),
        (["sft", "--model", files["policy"], "--data", files["sft"], "--out", project], "not empty"),
        (["dpo", "--config", project / "config.yaml", "--model", files["policy"], "--data", files["pairs"],
          "--out", project], "holds the --config file"),
        (train_args(files, project), "not empty"),
    ]  # fmt: skip
    for args, says in cases:
        assert_user_error(InProcess(capsys, *args), says, "Fix: --out a")
    assert {p: file_bytes(p) for p in (model, project)} == before


# -- outputs tried before the work; finished work kept -----------------------------------------------
def test_an_unwritable_result_is_refused_before_the_work(files, capsys):
    result = InProcess(capsys, *eval_args(files, "--out", "/proc/rlhf-nope/eval.json"))
    assert_user_error(result, "--out /proc/rlhf-nope/eval.json cannot be written", "Fix: pass --out")
    assert "loading" not in result.stdout + result.stderr.split("cannot be written")[0]
    with pytest.raises(ConfigError, match=r"the default rm_eval.json \(in the --reward-model folder\)"):
        refuse_foreign_file(
            Path("/proc/rlhf-rm/rm_eval.json"),
            ("a",),
            "rlhf rm-eval",
            "rm_eval.json",
            "in the --reward-model folder",
        )


def test_a_final_write_that_fails_keeps_the_result_in_a_named_file():
    with pytest.raises(ConfigError, match="the finished result is kept in") as refused:
        write_result(Path("/proc/rlhf-nope/eval.json"), {"comparison": {"win_rate": 0.5}})
    kept = str(refused.value).split("kept in ")[1].split(". Fix")[0]
    try:
        assert json.loads(Path(kept).read_text()) == {"comparison": {"win_rate": 0.5}}
    finally:
        os.unlink(kept)


# -- nothing waits forever, every optional package checked first ----------------------------------------
def test_a_fifo_data_file_is_refused(files, tmp_path, capsys):
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)
    result = InProcess(capsys, "dpo", "--model", files["policy"], "--data", fifo, "--out", tmp_path / "o")
    assert_user_error(result, "is a FIFO (named pipe)", "Fix: save the data to a file")
    with pytest.raises(ConfigError, match="FIFO"):
        check_input_file(str(fifo), "FILE")


def test_a_ray_address_that_does_not_answer_is_refused_in_seconds():
    with pytest.raises(ConfigError, match=r"ray.address '127.0.0.1:1': nothing answered within 2 s"):
        check_ray_address("127.0.0.1:1", timeout=2)
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        check_ray_address("no-port-here")


def test_a_missing_optional_package_is_refused_with_the_config(files, tmp_path, capsys, monkeypatch):
    import rlhf.rundir.preflight as preflight

    monkeypatch.setattr(preflight, "installed", lambda module: module not in ("wandb", "tensorboard"))
    out = tmp_path / "o"
    for flag, sinks in (("--sinks", "[console,wandb]"), ("--sinks", "[tensorboard]")):
        result = InProcess(
            capsys, "sft", "--model", files["policy"], "--data", files["sft"], "--out", out, flag, sinks
        )
        assert_user_error(result, "sinks", "package, which is not installed", "Fix: pip install")
        assert "loading the model" not in result.stdout
    assert not out.exists()


def test_a_world_judge_that_is_not_there_is_refused(files, capsys):
    result = InProcess(capsys, *eval_args(files, "--judge", "world:/nonexistent/world"))
    assert_user_error(
        result, "--judge world:/nonexistent/world: no readable world there", "Fix: pass world:DIR"
    )


def test_every_judge_has_its_tokenizer_checked(files, tmp_path, capsys):
    from tests.support.reliability_testing import other_tokenizer_reward_model

    foreign = other_tokenizer_reward_model(tmp_path / "foreign_rm")
    result = InProcess(capsys, *eval_args(files, "--judge", foreign, "--out", tmp_path / "e.json"))
    assert_user_error(result, f"--judge {foreign}")
    assert not (tmp_path / "e.json").exists()


# -- Ray sized to the machine ------------------------------------------------------------------------
def test_ray_started_here_fits_the_machine_and_explicit_values_are_kept():
    overrides = {
        "dist": {"runtime": "ray"},
        "model": {"policy": "p", "reward_model": "r"},
        "data": {"prompts": "x"},
    }
    config = load_config(RLConfig, preset="ppo_max", overrides=overrides)
    said = fit_ray_to_machine(config, set(), cpus=2)
    assert "2 CPUs for 4 role groups" in said and config.ray.policy.num_cpus == 0.5
    assert fit_ray_to_machine(config, set(), cpus=2) is None  # it fits now
    config = load_config(RLConfig, preset="ppo_max", overrides=overrides)
    with pytest.raises(ConfigError, match="lower the values you set"):
        fit_ray_to_machine(config, {"ray.critic.num_cpus"}, cpus=2)
    assert fit_ray_to_machine(config, set(), cpus=8) is None and config.ray.critic.num_cpus == 1.0


# -- resume never rewrites the past -----------------------------------------------------------------
@pytest.mark.slow
def test_resume_with_fewer_iterations_than_done_is_refused_and_changes_nothing(files, tmp_path, capsys):
    run = tmp_path / "run"
    assert_ok(
        InProcess(capsys, *train_args(files, run, "--train.iterations", "2", "--checkpoint.every", "1"))
    )
    before = file_bytes(run)
    result = InProcess(capsys, "train", "--resume", run, "--train.iterations", "1")
    assert_user_error(result, "train.iterations 1 is fewer than the 2 iterations the run already did", "Fix:")
    assert file_bytes(run) == before and iterations(run) == [0, 1]
    assert_ok(InProcess(capsys, "train", "--resume", run, "--train.iterations", "2"))  # all done: a no-op
    assert (run / "config.yaml").read_bytes() == before["config.yaml"]


@pytest.mark.slow
def test_dpo_resume_checks_the_model_it_started_from(files, tmp_path, capsys):
    model = tmp_path / "sft"
    shutil.copytree(files["policy"], model)
    run = tmp_path / "dpo"
    args = [
        "--data",
        files["pairs"],
        "--train.max_steps",
        "2",
        "--checkpoint.every",
        "1",
        "--sinks",
        "[jsonl]",
    ]
    assert_ok(InProcess(capsys, "dpo", "--model", model, "--out", run, *args))
    assert "model" in json.loads((run / "run_inputs.json").read_text())["models"]
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    assert_user_error(
        rlhf("dpo", "--resume", run),  # a subprocess: `rlhf dpo` as a shell starts it
        "rlhf dpo --resume",
        "config.json changed",
        "--resume-allow-changed-models",
    )
