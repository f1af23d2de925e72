"""The report of a training run directory: the kind read from its files, the summary figures against
the records themselves, a figure per monitor group, the collapse warnings at the detector's
iterations, samples escaped, and a refusal naming the fix for anything that is not a run."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from rlhf.monitor import CollapseDetector, MetricsLogger
from rlhf.monitor.run_files import NotARunDirectory, read_run_dir
from rlhf.monitor.run_kinds import GROUP_TITLES
from rlhf.monitor.run_report import SECTIONS, write_run_report
from tests.support.report_html import ReportPage

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script>"


def write_run(directory: Path, records: list[tuple[str, int, dict]], config: dict | None = None, warnings=()):
    """A run directory written by the real logger: (kind, step, metrics) records, (step, message) warnings."""
    with MetricsLogger(directory, sinks=("jsonl",)) as logger:
        for kind, step, metrics in records:
            logger.log(step, metrics, kind=kind)
        for step, message in warnings:
            logger.warn(message, step=step, kind="iteration")
    if config is not None:
        (directory / "config.yaml").write_text(yaml.safe_dump(config))
    return directory


def sft_run(directory: Path) -> Path:
    records = []
    for step in range(10):
        metrics = {"train/loss": 3.0 - 0.2 * step, "train/lr": 1e-5 * (step + 1), "train/tokens": 12}
        if step in (4, 9):
            metrics.update({"eval/loss": {4: 2.5, 9: 2.7}[step], "eval/ppl": {4: 12.2, 9: 14.9}[step]})
        records.append(("step", step, metrics))
    config = {
        "model": "base",
        "data": {"path": "sft.jsonl", "max_response_tokens": 256},
        "train": {"max_steps": 10},
    }
    return write_run(directory, records, config)


def images_are_pngs(page: ReportPage, section: str) -> int:
    images = page.images.get(section, [])
    for _, src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_SIGNATURE
    return len(images)


def test_sft_run_summary_matches_its_records_and_every_group_is_plotted(tmp_path):
    run = sft_run(tmp_path / "sft")
    page = ReportPage.of(write_run_report(run))
    assert page.h2 == list(SECTIONS)
    headline = page.rows("Summary", "metric")  # first, final, best, best at, final at
    assert headline["eval/loss"] == ["2.5", "2.7", "2.5", "4", "9"]
    assert headline["eval/ppl"] == ["12.2", "14.9", "12.2", "4", "9"]
    assert headline["train/loss"][:4] == ["3", f"{3.0 - 0.2 * 9:.4g}", f"{3.0 - 0.2 * 9:.4g}", "9"]
    facts = page.rows("Summary", "run")
    assert facts["kind"] == ["SFT (rlhf sft)"]
    assert facts["steps logged"] == ["0 – 9 (10 records)"]
    assert facts["planned steps"] == ["10 (reached)"]
    assert facts["model exported"] == ["no"]
    assert page.rows("Summary", "configuration")["data.path"] == ["sft.jsonl"]
    assert page.h3["Monitors"] == [GROUP_TITLES["train"], GROUP_TITLES["eval"]]
    assert images_are_pngs(page, "Monitors") == 2
    assert "Constant over the run: train/tokens = 12." in page.paragraphs["Monitors"]
    assert "an SFT run records losses only" in page.text("Samples")
    assert not list(run.glob(".*tmp"))


def test_a_run_stopped_early_says_where(tmp_path):
    run = sft_run(tmp_path / "sft")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["max_steps"] = 40
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    page = ReportPage.of(write_run_report(run))
    assert page.rows("Summary", "run")["planned steps"] == ["40 (stopped at 10)"]


def test_reward_model_run_plots_its_held_out_margins(tmp_path):
    margins = {3: [-0.5, 0.2, 0.4], 7: [0.1, 0.6, 0.9]}
    records = [
        (
            "step",
            step,
            {"train/loss": 0.7, "train/accuracy": 0.5 + 0.05 * step, "train/rank_loss": 0.69 - 0.01 * step},
        )
        for step in range(8)
    ]
    for step, values in margins.items():
        records[step][2].update({"eval/accuracy": sum(v > 0 for v in values) / 3, "eval/margins": values})
    run = write_run(tmp_path / "rm", records, {"model": "sft", "train": {"lm_coef": 1.0}})
    (run / "config.json").write_text("{}")
    page = ReportPage.of(write_run_report(run))
    assert read_run_dir(run).kind == "rm"
    assert page.rows("Summary", "run")["kind"] == ["reward model (rlhf rm)"]
    assert page.rows("Summary", "run")["model exported"] == ["yes"]
    assert page.rows("Summary", "metric")["eval/accuracy"] == [f"{2 / 3:.4g}", "1", "1", "7", "7"]
    assert "Held-out margins over training" in page.h3["Monitors"]
    assert images_are_pngs(page, "Monitors") == 3  # train, eval, margins


def rl_records(iterations: int = 30):
    """A collapsing policy: KL climbs, perplexity and length fall after iteration 10."""
    detector = CollapseDetector(kl_key="kl/ref", length_key="response/length_mean")
    records, warnings = (
        [
            ("pretrain", 0, {"critic_pretrain/value_loss": 0.9}),
            ("pretrain", 1, {"critic_pretrain/value_loss": 0.5}),
        ],
        [],
    )
    for i in range(iterations):
        late = max(0, i - 10)
        metrics = {
            "reward/raw_mean": 0.1 * i, "kl/ref": 0.01 + 0.05 * late, "kl/k1": 0.01 + 0.05 * late,
            "policy_ppl": 20.0 / (1 + 0.1 * late), "response/length_mean": 30.0 - late,
            "reward/raw_scores": [0.1 * i - 1, 0.1 * i, 0.1 * i + 1], "collapse": False, "policy/lr": 1e-6,
        }  # fmt: skip
        records.append(("iteration", i, metrics))
        warnings += [(i, message) for message in detector.update(i, metrics)]
    return records, warnings, detector.fired_steps


def test_rl_run_marks_the_collapse_warnings_at_the_detectors_iterations(tmp_path):
    records, warnings, fired = rl_records()
    assert fired, "the synthetic run must make the detector fire"
    warnings = [(0, "PPO-ptx is off: policy.ptx_coef > 0 but no data.ptx was given.")] + warnings
    config = {
        "preset": "ppo_max",
        "model": {"policy": "sft", "reward_model": "rm"},
        "rollout": {},
        "train": {"iterations": 30},
    }
    run = write_run(tmp_path / "ppo", records, config, warnings)
    page = ReportPage.of(write_run_report(run))
    assert page.h2 == list(SECTIONS)
    facts = page.rows("Summary", "run")
    assert facts["kind"] == ["RL (rlhf train)"]
    assert facts["iterations logged"] == ["0 – 29 (30 records)"]
    assert facts["critic pre-training iterations"] == ["2"]
    assert facts["collapse detector"] == [f"fired at iteration {', '.join(map(str, fired))}"]
    assert facts["warnings"] == [str(len(warnings))]
    rows = [row for row in page.tables["Warnings"][0][1:]]
    assert [(int(r[0]), r[1]) for r in rows] == [(i, "collapse") for i in fired] + [(0, "note")]
    assert all(r[2].startswith("pattern collapse suspected") for r in rows[:-1])
    assert page.h3["Monitors"] == [
        GROUP_TITLES["reward"], GROUP_TITLES["kl"], GROUP_TITLES["perplexity"], GROUP_TITLES["response"],
        GROUP_TITLES["policy"], GROUP_TITLES["critic_pretrain"], "Reward distribution over training",
    ]  # fmt: skip
    assert images_are_pngs(page, "Monitors") == 6  # the policy group holds a constant only: no figure
    notes = page.paragraphs["Monitors"]
    assert "Not drawn twice: kl/k1 (same as kl/ref)." in notes
    assert "Constant over the run: policy/lr = 1e-06." in notes
    assert "Dashed vertical lines: iterations where the collapse detector warned." in notes
    assert page.rows("Summary", "metric")["reward/raw_mean"] == ["0", "2.9", "2.9", "29", "29"]


def test_samples_and_eval_json_are_shown_escaped(tmp_path):
    records, _, _ = rl_records(12)
    run = write_run(tmp_path / "ppo", records)
    rows = [
        {"iteration": i, "prompt": [{"role": "user", "content": f"q{i} & more"}], "response": f"{EVIL} {i}", "reward": i / 10}
        for i in (0, 0, 5, 10)
    ]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    evaluation = {
        "policy": {"path": "runs/ppo", "mean": 0.4, "n": 2, "samples": ["first answer", "second answer"]},
        "baseline": {"path": "runs/sft", "mean": 0.1, "n": 2},
        "comparison": {"win_rate": 0.75, "n": 2},
        "judge": "runs/rm",
        "length": {
            "unit": "words",
            "length_controlled": {"win_rate": 0.61, "win_rate_ci95": [0.5, 0.7]},
            "length_matched": {"tolerance": 2, "n": 1, "win_rate": None, "win_rate_ci95": [0.0, 1.0]},
            "warning": "the judge's preference follows length <b>",
        },
    }
    (run / "eval.json").write_text(json.dumps(evaluation))
    text = write_run_report(run).read_text()
    assert EVIL not in text and "&lt;script&gt;" in text
    page = ReportPage.of(run / "report.html")
    assert page.h3["Samples"] == ["iteration 0", "iteration 10", "rlhf eval (eval.json)"]
    first, last, scores, evaluated = page.tables["Samples"]
    assert first[0] == ["iteration", "prompt", "response", "reward"]
    assert first[1:] == [["0", "user: q0 & more", f"{EVIL} 0", "0"]] * 2
    assert last[1:] == [["10", "user: q10 & more", f"{EVIL} 10", "1"]]
    assert scores[1:] == [["policy", "runs/ppo", "0.4", "2"], ["baseline", "runs/sft", "0.1", "2"]]
    assert [row for row in evaluated[1:]] == [["first answer"], ["second answer"]]
    assert any("win rate of the policy (ties half): 0.75" in p for p in page.paragraphs["Samples"])
    lengths = [p for p in page.paragraphs["Samples"] if "length-controlled" in p]
    assert "0.61 [0.5, 0.7]" in lengths[0] and "n=1): -" in lengths[0]
    assert any("warning: the judge's preference follows length <b>" in p for p in page.paragraphs["Samples"])


def test_empty_and_foreign_directories_are_refused_with_the_fix(tmp_path):
    with pytest.raises(
        NotARunDirectory, match="is not a run directory of rlhf.*Fix: pass the --out directory"
    ):
        read_run_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "acc": 0.5}\n')
    with pytest.raises(NotARunDirectory, match="not a run directory of rlhf"):
        write_run_report(tmp_path)
    assert not (tmp_path / "report.html").exists()
    with pytest.raises(NotARunDirectory, match="does not exist"):
        read_run_dir(tmp_path / "missing")
    with pytest.raises(NotARunDirectory, match="is a file, not a directory"):
        read_run_dir(tmp_path / "notes.txt")


def test_a_run_without_a_logged_step_and_a_damaged_metrics_file_are_refused(tmp_path):
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.yaml").write_text(yaml.safe_dump({"model": {"policy": "p"}, "rollout": {}}))
    with pytest.raises(
        NotARunDirectory, match="RL run that has logged no training step yet.*metrics.jsonl is missing"
    ):
        read_run_dir(started)
    damaged = sft_run(tmp_path / "damaged")
    lines = (damaged / "metrics.jsonl").read_text().splitlines()
    (damaged / "metrics.jsonl").write_text("\n".join(lines[:2] + ["{oops"] + lines[2:]) + "\n")
    with pytest.raises(NotARunDirectory, match=r"metrics.jsonl:3: .*Fix: repair or delete that line"):
        read_run_dir(damaged)


def test_the_kind_comes_from_the_config_when_records_are_ambiguous(tmp_path):
    # records with a step but no loss or accuracy key: the config decides
    run = write_run(
        tmp_path / "rm", [("step", 0, {"train/grad_norm": 1.0})], {"model": "m", "train": {"lm_coef": 0.0}}
    )
    assert read_run_dir(run).kind == "rm"
