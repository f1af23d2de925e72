"""Every training command ends with report.html, named in its final summary; `rlhf report` rebuilds it
for any run directory; a report that fails never fails the run."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from rlhf.cli import main
from rlhf.monitor.run_report import SECTIONS
from tests.support.reliability_testing import TINY_TRAIN, InProcess, assert_user_error
from tests.support.report_html import ReportPage

TINY_SUPERVISED = ["--train.max_steps", "4", "--train.batch_size", "4", "--train.eval_every", "2",
                   "--sinks", "[jsonl]", "--data.test_fraction", "0.25"]  # fmt: skip


def run_cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """A tiny sft, rm and ppo_max run through the CLI: {kind: (run directory, stdout)}."""
    root = tmp_path_factory.mktemp("reports")
    done = {}
    for kind, args in (
        ("sft", ["sft", "--model", files["policy"], "--data", files["sft"], *TINY_SUPERVISED]),
        ("rm", ["rm", "--model", files["policy"], "--data", files["pairs"], *TINY_SUPERVISED]),
        ("rl", ["train", "--preset", "ppo_max", "--policy", files["policy"], "--reward-model", files["rm"],
                "--prompts", files["prompts"], *TINY_TRAIN, "--train.iterations", "3",
                "--critic.pretrain_iterations", "2"]),
    ):  # fmt: skip
        out = root / kind
        code, stdout, stderr = run_cli(*args, "--out", out)
        assert code == 0, stderr[-3000:]
        done[kind] = (out, stdout)
    return done


def metric_records(run: Path, key: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r]


@pytest.mark.parametrize("kind", ["sft", "rm", "rl"])
@pytest.mark.slow
def test_a_training_command_writes_its_report_and_names_it(runs, kind):
    run, stdout = runs[kind]
    report = run / "report.html"
    assert stdout.splitlines()[-1] == f"report: {report}"  # after the summary table, never cut short
    kept = stdout.splitlines()[-2]  # before it: what the run directory keeps, and why
    assert kept.startswith(f"{run} keeps ") and "the exported model" in kept
    assert ("checkpoints/" in kept) == (kind == "rl")  # sft and rm keep none
    page = ReportPage.of(report)
    assert page.h2 == list(SECTIONS)
    assert page.rows("Summary", "run")["kind"][0].endswith(
        {"sft": "(rlhf sft)", "rm": "(rlhf rm)", "rl": "(rlhf train)"}[kind]
    )
    assert page.rows("Summary", "run")["model exported"] == ["yes"]
    assert len(page.images["Monitors"]) >= 2
    step_key = "iteration" if kind == "rl" else "step"
    last = metric_records(run, step_key)[-1]
    headline = page.rows("Summary", "metric")
    final_key = {"sft": "eval/loss", "rm": "eval/accuracy", "rl": "reward/raw_mean"}[kind]
    assert headline[final_key][1] == f"{last[final_key]:.4g}"


@pytest.mark.slow
def test_the_rl_report_shows_pretraining_and_the_ptx_note_with_its_iteration(runs):
    run, _ = runs["rl"]
    page = ReportPage.of(run / "report.html")
    assert page.rows("Summary", "run")["critic pre-training iterations"] == ["2"]
    assert page.rows("Summary", "run")["collapse detector"] == ["did not fire"]
    assert "Critic pre-training (policy frozen)" in page.h3["Monitors"]
    assert "Reward distribution over training" in page.h3["Monitors"]
    warnings = page.tables["Warnings"][0]
    assert warnings[1][:2] == ["0", "note"] and warnings[1][2].startswith("PPO-ptx is off")


@pytest.mark.parametrize("kind", ["sft", "rm", "rl"])
@pytest.mark.slow
def test_rlhf_report_rebuilds_the_same_report(runs, kind, capsys):
    run, _ = runs[kind]
    before = (run / "report.html").read_text()
    (run / "report.html").unlink()
    result = InProcess(capsys, "report", run)
    assert result.returncode == 0 and result.stdout.strip() == f"report: {run / 'report.html'}"
    after = (run / "report.html").read_text()
    assert ReportPage(after).tables == ReportPage(before).tables


def test_rlhf_report_on_an_empty_or_a_foreign_directory_is_a_user_error(tmp_path, capsys):
    assert_user_error(InProcess(capsys, "report", tmp_path), str(tmp_path), "not a run directory", "Fix:")
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (tmp_path / "config.yaml").write_text("learning_rate: 0.1\n")
    assert_user_error(InProcess(capsys, "report", tmp_path), str(tmp_path), "rlhf train", "rlhf demo")
    assert not (tmp_path / "report.html").exists()


def test_a_report_that_fails_does_not_fail_the_run(files, tmp_path, monkeypatch):
    def broken(directory, run=None):
        raise RuntimeError("matplotlib exploded")

    monkeypatch.setattr("rlhf.monitor.run_report.write_run_report", broken)
    out = tmp_path / "sft"
    code, stdout, stderr = run_cli(
        "sft", "--model", files["policy"], "--data", files["sft"], *TINY_SUPERVISED, "--out", out
    )
    assert code == 0
    assert (
        "warning: the run finished, but its report could not be written (RuntimeError: matplotlib exploded)"
        in stderr
    )
    assert f"rlhf report {out}" in stderr and "Traceback" not in stderr
    assert stdout.splitlines()[-1] == "report: not written (RuntimeError: matplotlib exploded)"
    assert (out / "model.safetensors").is_file() and not (out / "report.html").exists()


@pytest.mark.slow
def test_a_run_directory_that_cannot_be_written_is_a_user_error(runs, capsys, monkeypatch):
    run, _ = runs["sft"]

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refused)  # root ignores file modes: refuse the write itself
    result = InProcess(capsys, "report", run)
    assert_user_error(
        result, f"cannot write the report into {run}", "Permission denied", "Fix: make the directory"
    )


@pytest.mark.slow
def test_rlhf_report_refuses_extra_arguments(runs, capsys):
    run, _ = runs["sft"]
    assert_user_error(
        InProcess(capsys, "report", run, "--title", "x"), "unexpected arguments ['--title', 'x']"
    )
