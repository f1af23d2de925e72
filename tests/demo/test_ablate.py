"""`rlhf ablate` on a 2-iteration tiny setting: each variant differs from the full preset in exactly
the switch it names; the numbers are the closed forms of stats.py; a resumed ablation skips the
stage and every finished run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.cli import main
from rlhf.config import to_dict
from rlhf.demo.ablate import TRICKS, run_ablation, variants
from rlhf.demo.ablate import runner as ablate_runner
from rlhf.demo.ablate.runner import ABLATABLE_PRESETS, ABLATE_RL
from rlhf.demo.ablate.stats import gold_at_kl, mean_ci, verdict
from rlhf.demo.ablate.tricks import OPTIONAL_TRICKS, resolved

TINY = [
    "--sft_steps", "4", "--rm_steps", "4", "--iterations", "2", "--eval_every", "1", "--eval_prompts", "4",
    "--world.sft_train_examples", "32", "--world.sft_test_examples", "8",
    "--world.pairs_train", "32", "--world.pairs_test", "8",
    "--model.hidden_size", "16", "--model.num_layers", "1", "--model.num_heads", "2",
    "--rl.rollout.batch_size", "4", "--rl.rollout.max_new_tokens", "4",
    "--rl.critic.pretrain_iterations", "1",
]  # fmt: skip


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


@pytest.mark.parametrize("preset", ABLATABLE_PRESETS)
def test_each_variant_differs_from_the_full_preset_in_exactly_its_switch(preset):
    found, skipped = variants(preset, ABLATE_RL, extra=OPTIONAL_TRICKS)
    assert found[0].name == "full" and found[0].overrides == {}
    full = leaves(to_dict(resolved(preset, ABLATE_RL, found[0])))
    by_name = {t.name: t for t in TRICKS}
    for variant in found[1:]:
        differs = {
            k for k, v in leaves(to_dict(resolved(preset, ABLATE_RL, variant))).items() if full[k] != v
        }
        assert differs == by_name[variant.trick].fields(), variant.name
        prefix = "no_" if variant.name.startswith("no_") else "with_"
        assert variant.name == prefix + variant.trick
    named = {v.trick for v in found[1:]} | {s["trick"] for s in skipped}
    assert named == set(by_name)  # every trick is a variant or skipped with its reason
    if preset in ("apa", "awr"):  # Clip-Cov / KL-Cov act on the ppo loss's tokens
        assert {s["trick"] for s in skipped} >= {"clip_cov", "kl_cov"}
    else:
        assert {"with_clip_cov", "with_kl_cov", "with_rollout_correction"} <= {v.name for v in found}


def test_the_optional_tricks_are_ablated_only_when_named():
    plain = {v.trick for v in variants("ppo_max", ABLATE_RL)[0][1:]}
    assert not plain & set(OPTIONAL_TRICKS)
    named = [v.name for v in variants("ppo_max", ABLATE_RL, extra=("kl_cov",))[0]]
    assert named[-1] == "with_kl_cov" and "with_clip_cov" not in named


def test_ppo_max_switches_its_tricks_off_and_adds_whitening():
    names = [v.name for v in variants("ppo_max", ABLATE_RL)[0]]
    assert names == [
        "full", "no_reward_normalization", "no_reward_clipping", "no_kl_penalty",
        "no_critic_from_reward_model", "no_critic_pretraining", "no_gradient_clipping",
        "no_value_clipping", "with_advantage_whitening", "no_small_buffer",
    ]  # fmt: skip
    skipped = variants("ppo_max", ABLATE_RL)[1]
    assert [s["trick"] for s in skipped] == ["ptx"]  # no ptx data on the built-in world


def test_interval_and_gold_at_a_kl_budget_by_hand():
    stat = mean_ci([1.0, 2.0, 6.0])  # mean 3, sd sqrt(7), t(0.975, 2) = 4.303
    half = 4.303 * math.sqrt(7) / math.sqrt(3)
    assert stat["mean"] == 3.0 and stat["ci95"] == pytest.approx([3 - half, 3 + half])
    assert mean_ci([5.0])["ci95"] is None
    trajectory = [(0.0, 1.0), (1.0, 2.0), (3.0, 4.0), (2.5, 5.0)]
    assert gold_at_kl(trajectory, 2.0) == (pytest.approx(3.0), True)  # halfway from (1, 2) to (3, 4)
    assert gold_at_kl(trajectory, 9.0) == (5.0, False)  # never reached: the last gold
    assert verdict({"ci95": [-0.5, 0.2]}) == "no measurable effect"
    assert verdict({"ci95": [0.1, 0.2]}) == "higher" and verdict({"ci95": [-0.3, -0.1]}) == "lower"
    assert verdict({"ci95": None}) == "no measurable effect"


@pytest.fixture(scope="module")
def ablated(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ablate")
    assert run_ablation(out=str(out), preset="ppo_max", seeds=1, overrides=TINY, quiet=True) == 0
    return out


@pytest.mark.slow
def test_ablation_json_has_every_variant_with_its_numbers(ablated):
    ablation = json.loads((ablated / "ablation.json").read_text())
    rows = {r["variant"]: r for r in ablation["variants"]}
    assert list(rows) == [v.name for v in variants("ppo_max", ABLATE_RL)[0]]
    sft_gold = ablation["sft"]["gold_mean"]
    for name, row in rows.items():
        (run,) = row["runs"]
        result = json.loads((ablated / "runs" / f"{name}-seed0" / "result.json").read_text())
        assert run["gold_gain_end"] == pytest.approx(result["final"]["gold"] - sft_gold)
        assert [t["iteration"] for t in result["trajectory"]][-1] == 2
        assert row["collapse"] in ("0/1", "1/1")
        if name != "full":
            full_run = rows["full"]["runs"][0]
            assert row["vs_full"]["gold_gain_end"]["mean"] == pytest.approx(
                run["gold_gain_end"] - full_run["gold_gain_end"]
            )
    assert (ablated / "ablation.md").read_text().count("\n| ") == len(rows)  # a line per variant
    report = (ablated / "report.html").read_text()
    assert "forest plot" in report and "no_kl_penalty" in report and "skipped" in report


@pytest.mark.slow
def test_a_resumed_ablation_runs_only_what_did_not_finish(ablated, monkeypatch):
    before = json.loads((ablated / "ablation.json").read_text())
    (ablated / "runs" / "no_kl_penalty-seed0" / "result.json").unlink()  # as if interrupted there
    ran = []
    original = ablate_runner.run_one_variant
    monkeypatch.setattr(
        ablate_runner, "run_one_variant", lambda *a, **k: ran.append(a[4].name) or original(*a, **k)
    )
    monkeypatch.setattr(ablate_runner, "prepare_stage", lambda *a, **k: pytest.fail("the stage was rebuilt"))
    assert run_ablation(out=str(ablated), preset="ppo_max", seeds=1, overrides=TINY, quiet=True) == 0
    assert ran == ["no_kl_penalty"]
    after = json.loads((ablated / "ablation.json").read_text())
    for a, b in zip(before["variants"], after["variants"]):  # a rerun on the CPU repeats its numbers
        assert a["runs"][0]["gold_gain_end"] == pytest.approx(b["runs"][0]["gold_gain_end"], abs=1e-5)


@pytest.mark.slow
def test_other_run_settings_rerun_every_run_over_the_same_stage(tmp_path, monkeypatch):
    out = tmp_path / "a"
    tiny = [*TINY, "--world.pairs_train", "16"]
    assert run_ablation(out=str(out), preset="vanilla_ppo", seeds=1, overrides=tiny, quiet=True) == 0
    monkeypatch.setattr(ablate_runner, "prepare_stage", lambda *a, **k: pytest.fail("the stage was rebuilt"))
    ran = []
    original = ablate_runner.run_one_variant
    monkeypatch.setattr(
        ablate_runner, "run_one_variant", lambda *a, **k: ran.append(a[4].name) or original(*a, **k)
    )
    assert (
        run_ablation(
            out=str(out), preset="vanilla_ppo", seeds=1, overrides=[*tiny, "--iterations", "1"], quiet=True
        )
        == 0
    )
    ablation = json.loads((out / "ablation.json").read_text())
    assert ran == [r["variant"] for r in ablation["variants"]]  # none of the 2-iteration runs is reused
    result = json.loads((out / "runs" / "full-seed0" / "result.json").read_text())
    assert result["iterations"] == 1 and result["run_key"]["iterations"] == 1


@pytest.mark.slow
def test_resuming_with_other_settings_is_refused(ablated, capsys):
    code = main(["ablate", "--out", str(ablated), "--seeds", "1", *TINY[:-2], "--rl.critic.pretrain_iterations", "1",
                 "--world.seed", "3"])  # fmt: skip
    assert code == 2
    assert "holds an ablation with other settings" in capsys.readouterr().err


def test_bad_arguments_exit_2_naming_the_flag(tmp_path, capsys):
    assert main(["ablate", "--preset", "ppo_min", "--out", str(tmp_path / "a")]) == 2
    assert "--preset 'ppo_min' is not a preset" in capsys.readouterr().err
    assert main(["ablate", "--seeds", "0", "--out", str(tmp_path / "b")]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert main(["ablate", "--preset", "grpo", "--out", str(tmp_path / "c")]) == 2
    assert "--preset grpo trains no critic" in capsys.readouterr().err
    assert set(ABLATABLE_PRESETS) == {"vanilla_ppo", "ppo_max", "apa", "awr"}
