"""Guards of every stage, run in-process through `rlhf.cli.main` (fast): the run-directory lock of
sft/rm/demo, Ctrl-C in a stage that cannot resume, and model directories given in the wrong role."""

from __future__ import annotations

import json
import os

import pytest

from rlhf.cli import main
from rlhf.rundir.lock import LOCK_FILE, run_dir_lock
from tests.support.reliability_testing import train_args


@pytest.mark.parametrize("stage", ["sft", "rm", "demo"])
def test_a_locked_run_directory_is_refused_by_every_writing_stage(files, tmp_path, capsys, stage):
    out = tmp_path / "busy"
    args = {
        "sft": ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out],
        "rm": ["rm", "--model", files["policy"], "--data", files["pairs"], "--out", out],
        "demo": ["demo", "--out", out],
    }[stage]
    with run_dir_lock(out):
        assert main([str(a) for a in args]) == 2
        err = capsys.readouterr().err
    assert f"run directory {out} is in use by another rlhf process (pid {os.getpid()})" in err
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing else was written


def test_the_lock_is_free_again_after_its_holder_ends(tmp_path):
    with run_dir_lock(tmp_path / "run"):
        pass
    with run_dir_lock(tmp_path / "run"):  # a stale lock file is no lock
        assert (tmp_path / "run" / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_ctrl_c_in_sft_says_it_cannot_resume_and_what_to_do(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sft"

    def interrupted(config):
        (out / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"step": 10}) + "\n")
        raise KeyboardInterrupt

    monkeypatch.setattr("rlhf.stages.sft.run_sft", interrupted)
    code = main(["sft", "--model", str(files["policy"]), "--data", str(files["sft"]), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert "interrupted (last logged step 10)" in err and "cannot resume" in err and "another --out" in err


def test_ctrl_c_before_a_checkpoint_does_not_promise_a_resume(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "rl"

    def interrupted(config):
        (out / "metrics.jsonl").write_text(json.dumps({"iteration": 0}) + "\n")
        raise KeyboardInterrupt

    monkeypatch.setattr("rlhf.stages.train.run_rl", interrupted)
    assert main([str(a) for a in train_args(files, out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted at iteration 1; no checkpoint was saved yet" in err and "--checkpoint.every" in err
    assert "--resume" not in err


def test_a_reward_model_as_policy_and_a_causal_lm_as_reward_model_are_named(files, tmp_path, capsys):
    assert main([str(a) for a in train_args({**files, "policy": files["rm"]}, tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"--policy {files['rm']} is a reward-model directory" in err and "rlhf sft" in err
    assert main([str(a) for a in train_args({**files, "rm": files["policy"]}, tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "scalar_head.safetensors" in err and "`rlhf rm`" in err and "Traceback" not in err


def test_a_model_without_tokenizer_and_an_unknown_architecture_are_named(files, tmp_path, capsys):
    import shutil

    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(files["policy"] / name, no_tokenizer / name)
    unknown = tmp_path / "unknown"
    shutil.copytree(files["policy"], unknown)
    config = json.loads((unknown / "config.json").read_text())
    config.update(model_type="notamodel", architectures=["NotAModel"])
    (unknown / "config.json").write_text(json.dumps(config))
    for model, named in ((no_tokenizer, "tokenizer.save_pretrained"), (unknown, "model_type")):
        args = ["sft", "--model", model, "--data", files["sft"], "--out", tmp_path / f"out-{model.name}"]
        assert main([str(a) for a in args]) == 2
        err = capsys.readouterr().err
        assert str(model) in err and named in err and "Traceback" not in err


def test_ctrl_c_in_the_demo_says_a_rerun_starts_over(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("rlhf.demo.run.run_demo", lambda **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 130
    err = capsys.readouterr().err
    assert f"rlhf demo --out {tmp_path / 'demo'}" in err and "starts over" in err and "Traceback" not in err


def test_a_reward_model_export_keeps_the_run_records(files, tmp_path, capsys):
    """Without held-out pairs the model is exported into the run directory itself: its metrics and
    config stay (the export used to replace the whole directory)."""
    out = tmp_path / "rm"
    args = ["rm", "--model", files["policy"], "--data", files["pairs"], "--out", out, "--sinks", "jsonl",
            "--data.test_fraction", "0", "--train.max_steps", "2", "--train.batch_size", "2"]  # fmt: skip
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert (out / "config.yaml").is_file() and (out / "scalar_head.safetensors").is_file()
    assert not list(out.glob(".export*"))
