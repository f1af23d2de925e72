"""A very short demo runs end to end: world, SFT, reward model, RL runs of every algorithm, DPO,
report.

The full-length results are a benchmark (bench/speed/demo_timing.py), not a test: here only the
pipeline's wiring, the report's sections and the summary's schema are checked.
"""

from __future__ import annotations

import json

import pytest
import torch

from rlhf.demo.report import SECTIONS
from rlhf.demo.run import ALGORITHMS, run_demo

TINY = [
    "--sft_steps", "6", "--rm_steps", "6", "--iterations", "3", "--eval_every", "2", "--eval_prompts", "8",
    "--world.sft_train_examples", "64", "--world.sft_test_examples", "16",
    "--world.pairs_train", "64", "--world.pairs_test", "16",
    "--model.hidden_size", "16", "--model.num_layers", "1", "--model.num_heads", "2",
    "--rl.rollout.batch_size", "8", "--rl.rollout.max_new_tokens", "6",
    "--rl.critic.pretrain_iterations", "1",
    "--dpo_steps", "4", "--dpo_batch_size", "8", "--dpo_eval_every", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("demo")
    assert run_demo(out=str(out), compare=True, seeds=1, overrides=TINY, quiet=True) == 0
    return out


@pytest.mark.slow
def test_summary_follows_the_documented_schema(demo_dir):
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert {"gold_mean", "gold_std", "proxy_mean"} <= set(summary["sft"])
    assert {"label_accuracy", "gold_accuracy"} <= set(summary["reward_model"])
    assert 0.0 <= summary["reward_model"]["label_accuracy"] <= 1.0
    assert 0.0 <= summary["reward_model"]["gold_accuracy"] <= 1.0
    rl_runs = [r for r in summary["runs"] if r["algorithm"] != "dpo"]
    assert sorted(r["algorithm"] for r in rl_runs) == sorted(ALGORITHMS)
    for run in rl_runs:
        assert set(run) >= {
            "algorithm",
            "seed",
            "final",
            "peak_gold",
            "collapse_detected",
            "iterations",
            "seconds",
        }
        assert set(run["final"]) == {"proxy", "gold", "kl", "ppl", "length", "distinct2"}
        assert run["iterations"] == 3
        assert run["peak_gold"] >= run["final"]["gold"]
        assert run["final"]["ppl"] >= 1.0
        assert 0.0 <= run["final"]["distinct2"] <= 1.0
    claims = [f["claim"] for f in summary["findings"]]
    assert len(claims) == 5 and all(isinstance(f["holds"], bool) for f in summary["findings"])


@pytest.mark.slow
def test_compare_trains_dpo_on_the_reward_models_pairs_and_evaluates_it_as_the_rl_runs(demo_dir):
    summary = json.loads((demo_dir / "summary.json").read_text())
    (dpo,) = [r for r in summary["runs"] if r["algorithm"] == "dpo"]
    assert dpo["seed"] == 0 and dpo["steps"] == 4 and "iterations" not in dpo
    assert dpo["collapse_detected"] is None  # no detector watches DPO's steps
    assert set(dpo["final"]) == {"proxy", "gold", "kl", "ppl", "length", "distinct2"}
    assert dpo["peak_gold"] >= dpo["final"]["gold"] and 0.0 <= dpo["pair_accuracy"] <= 1.0
    (run,) = [r for r in json.loads((demo_dir / "runs.json").read_text()) if r["algorithm"] == "dpo"]
    assert run["x_axis"] == "optimizer step"
    assert [h["step"] for h in run["eval"]] == [0, 2, 4]  # the SFT start, then every dpo_eval_every
    rl = next(r for r in json.loads((demo_dir / "runs.json").read_text()) if r["algorithm"] == "ppo_max")
    for key in ("gold", "proxy", "length", "distinct2", "kl", "ppl"):  # the SFT model, sampled alike
        assert run["eval"][0][key] == pytest.approx(rl["eval"][0][key], abs=1e-2), key
    config = (demo_dir / "runs" / "dpo-seed0" / "config.yaml").read_text()
    assert "pairs_train.jsonl" in config and "test_fraction: 0.0" in config  # the proxy's own pairs
    equal = summary["equal_kl"]
    assert equal["kl_budget"] == 2.0
    assert set(equal["algorithms"]) == {*ALGORITHMS, "dpo"}
    for row in equal["algorithms"].values():
        assert {"gold_gain_at_kl", "gold_gain_end", "kl_end", "reached_kl_budget"} <= set(row)
        assert row["reached_kl_budget"] in ("0/1", "1/1")


@pytest.mark.slow
def test_report_has_every_section_and_embeds_its_figures(demo_dir):
    html = (demo_dir / "report.html").read_text()
    for section in SECTIONS:
        assert f">{section}<" in html, section
    assert html.count("data:image/png;base64,") >= 5  # DPO's curves: against its optimizer steps
    assert "Against optimizer steps:</b> dpo" in html and "gold gain at KL 2" in html
    assert "http://" not in html and "https://" not in html
    assert (demo_dir / "report_overview.png").stat().st_size > 1000


@pytest.mark.slow
def test_every_stage_leaves_its_artifacts(demo_dir):
    for name in ("sft_train.jsonl", "pairs_train.jsonl", "prompts_test.jsonl", "world.json"):
        assert (demo_dir / "world" / name).exists()
    assert (demo_dir / "sft" / "model.safetensors").exists()
    assert (demo_dir / "rm" / "scalar_head.safetensors").exists()
    for algorithm in ALGORITHMS:
        run = demo_dir / "runs" / f"{algorithm}-seed0"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in rows if "iteration" in r and "event" not in r] == [0, 1, 2]
        assert (run / "config.yaml").exists()
    assert (demo_dir / "runs" / "dpo-seed0" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_rerun_into_the_same_directory_starts_clean(demo_dir):
    short = TINY + ["--iterations", "1", "--sft_steps", "2", "--rm_steps", "2"]  # later flags win
    assert run_demo(out=str(demo_dir / "again"), seeds=1, overrides=short, quiet=True) == 0
    assert run_demo(out=str(demo_dir / "again"), seeds=1, overrides=short, quiet=True) == 0
    summary = json.loads((demo_dir / "again" / "summary.json").read_text())
    assert [r["algorithm"] for r in summary["runs"]] == ["ppo_max"]
    assert "equal_kl" not in summary  # DPO and the equal-KL table come with --compare only


@pytest.mark.slow
def test_rlhf_report_rebuilds_the_demo_report_and_reports_each_run_of_it(demo_dir, capsys):
    from rlhf.cli import main
    from rlhf.monitor.run_report import SECTIONS as RUN_SECTIONS
    from tests.support.report_html import ReportPage

    before = ReportPage.of(demo_dir / "report.html")
    (demo_dir / "report.html").unlink()
    assert main(["report", str(demo_dir)]) == 0
    after = ReportPage.of(demo_dir / "report.html")
    assert after.h2 == list(SECTIONS) and after.tables == before.tables
    run = demo_dir / "runs" / "ppo_max-seed0"
    assert main(["report", str(run)]) == 0  # a run of the demo is an RL run directory like any other
    page = ReportPage.of(run / "report.html")
    assert page.h2 == list(RUN_SECTIONS) and page.rows("Summary", "run")["kind"] == ["RL (rlhf train)"]
    assert "eval/gold" in page.rows("Summary", "metric")  # the demo's evaluations join the headline
    assert main(["report", str(demo_dir / "runs" / "dpo-seed0")]) == 0  # and its DPO run a DPO run
    for stage in ("sft", "rm"):  # the demo's SFT and reward-model stages end with their own report
        assert ReportPage.of(demo_dir / stage / "report.html").h2 == list(RUN_SECTIONS)
    capsys.readouterr()


def test_the_demo_keeps_the_settings_it_was_measured_with():
    """The presets follow the papers (docs/algorithms.md §23); the demo pins the values its
    measured findings (bench/results/demo.json) were run with, so its summary does not move."""
    from rlhf.config import RLConfig, load_config
    from rlhf.demo.run import ALGORITHMS, DemoConfig, demo_rl_overrides

    measured = {  # (reward.clip, advantage.whiten, model.critic_init, kl.beta, policy.awr_max_weight)
        "vanilla_ppo": (None, True, "policy", 0.0, 20.0),
        "ppo_max": (5.0, True, "reward_model", 0.1, 20.0),
        # the APA paper's whitening and uncapped AWR weights, the demo's KL penalty (bench/studies/ablation.md)
        "apa": (5.0, True, "reward_model", 0.1, 20.0),  # the AWR cap: unused by APA's loss
        "awr": (5.0, True, "reward_model", 0.1, None),
    }
    for algorithm in measured:  # the critic-free ones (grpo, rloo) came after that measurement
        assert algorithm in ALGORITHMS
        c = load_config(RLConfig, preset=algorithm, overrides=demo_rl_overrides(DemoConfig(), algorithm))
        got = (c.reward.clip, c.advantage.whiten, c.model.critic_init, c.kl.beta, c.policy.awr_max_weight)
        assert got == measured[algorithm], algorithm
        assert (c.train.minibatches, c.policy_optim.lr, c.critic_optim.lr) == (2, 3e-4, 1e-3)
        assert c.policy_optim.warmup_fraction == c.critic_optim.warmup_fraction == 0.0


@pytest.mark.slow
def test_compare_only_trains_just_the_named_runs_with_the_same_figures(demo_dir, tmp_path, capsys):
    from rlhf.cli import main

    out = tmp_path / "only"
    assert main(["demo", "--compare-only", "ppo_max,dpo", "--out", str(out), *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["algorithm"] for r in summary["runs"]] == ["ppo_max", "dpo"]
    assert set(summary["equal_kl"]["algorithms"]) == {"ppo_max", "dpo"}
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["dpo-seed0", "ppo_max-seed0"]
    full = json.loads((demo_dir / "summary.json").read_text())  # --compare with every run
    for algorithm in ("ppo_max", "dpo"):
        (mine,) = [r for r in summary["runs"] if r["algorithm"] == algorithm]
        (theirs,) = [r for r in full["runs"] if r["algorithm"] == algorithm]
        assert mine["final"] == pytest.approx(theirs["final"], rel=1e-5), algorithm
        for key in ("gold_gain_at_kl", "gold_gain_end", "kl_end"):
            mine_kl, theirs_kl = (s["equal_kl"]["algorithms"][algorithm][key] for s in (summary, full))
            assert mine_kl["mean"] == pytest.approx(theirs_kl["mean"], rel=1e-5), (algorithm, key)


def test_each_run_samples_as_many_responses_whatever_ran_before():
    from rlhf.demo.run import DEMO_RL, DemoConfig, demo_rl_overrides

    prompts = {
        a: demo_rl_overrides(DemoConfig(), a)["rollout"]["batch_size"]
        for a in ("grpo", "online_dpo", "ppo_max")
    }
    assert prompts == {"grpo": 16, "online_dpo": 32, "ppo_max": 64}  # 64 responses each
    assert DEMO_RL["rollout"]["batch_size"] == 64


def test_compare_only_refuses_a_name_that_is_not_a_run(tmp_path):
    from rlhf.config import ConfigError

    with pytest.raises(ConfigError, match="ppo_mx.*Fix: a comma-separated subset of vanilla_ppo,"):
        run_demo(out=str(tmp_path / "bad"), compare_only=["ppo_mx", "dpo"], overrides=TINY, quiet=True)
    assert not (tmp_path / "bad").exists()  # refused before anything was written
