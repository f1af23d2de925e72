"""The one error path of `rlhf`: a user error is one message and exit 2; a bug is a short message
plus a log file holding the traceback, exit 1; a full disk says what to do."""

from __future__ import annotations

import errno

from rlhf.cli import main
from tests.support.reliability_testing import InProcess, assert_user_error


def test_report_on_a_directory_that_is_not_a_demo_is_a_user_error(tmp_path, capsys):
    assert_user_error(InProcess(capsys, "report", tmp_path), str(tmp_path), "summary.json", "rlhf demo")


def test_an_internal_error_leaves_its_traceback_in_the_run_directory(files, tmp_path, capsys, monkeypatch):
    def broken(config):
        raise KeyError("value/loss")  # a bug somewhere inside the stage

    monkeypatch.setattr("rlhf.stages.sft.run_sft", broken)
    out = tmp_path / "sft"
    code = main(["sft", "--model", str(files["policy"]), "--data", str(files["sft"]), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err and "internal error (KeyError: 'value/loss')" in err
    log = out / "error.log"
    assert str(log) in err
    assert "Traceback" in log.read_text() and "in broken" in log.read_text()


def test_an_internal_error_before_a_run_directory_goes_to_a_temporary_log(capsys, monkeypatch):
    monkeypatch.setattr("rlhf.cli.report.run_report_command", lambda args, rest, ctx: 1 / 0)
    assert main(["report", "anywhere"]) == 1
    err = capsys.readouterr().err
    path = err.split("the traceback is in ")[1].split(" ")[0]
    assert "ZeroDivisionError" in open(path).read()


def test_a_full_disk_is_a_message_with_the_way_on(files, tmp_path, capsys, monkeypatch):
    def full(config):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "sft" / "model.safetensors"))

    monkeypatch.setattr("rlhf.stages.sft.run_sft", full)
    code = main(
        ["sft", "--model", str(files["policy"]), "--data", str(files["sft"]), "--out", str(tmp_path / "sft")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "no space left on the device" in err and "model.safetensors" in err and "free disk space" in err


def test_a_message_exit_is_exit_2(capsys):
    assert main(["report", "some_run", "--bogus", "1"]) == 2
    assert "unexpected arguments" in capsys.readouterr().err


def test_an_unknown_flag_of_eval_names_the_key_and_the_fix(capsys):
    assert (
        main(["eval", "--policy", "p", "--baseline", "b", "--judge", "j", "--prompts", "x", "--bogus", "1"])
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown key 'bogus'" in err and "Fix: drop --bogus" in err and "Traceback" not in err
