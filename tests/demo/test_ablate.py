"""`rlhf ablate` on a 2-iteration tiny setting: each variant differs from the full preset in exactly
the switch it names (a later paper's loss, Clip-Cov, rollout correction only when named, skipped
with the reason where they cannot act); an arm runs another preset (online DPO) at the ablation's
scale; the numbers are the closed forms of stats.py; a resumed ablation skips the stage and every
finished run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.cli import main
from rlhf.config import PRESETS, ConfigError, RLConfig, deep_merge, load_config, to_dict
from rlhf.demo.ablate import TRICKS, run_ablation, variants
from rlhf.demo.ablate import runner as ablate_runner
from rlhf.demo.ablate.arms import ARM_SOURCES, arm_variants, run_layers
from rlhf.demo.ablate.runner import ABLATABLE_PRESETS, ABLATE_RL, run_one_variant
from rlhf.demo.ablate.stats import gold_at_kl, mean_ci, verdict
from rlhf.demo.ablate.tricks import NO_MISMATCH, OPTIONAL_TRICKS, resolved
from rlhf.demo.run import demo_config, prepare_stage

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


BF16 = {**ABLATE_RL, "dtype": "bfloat16"}  # a sampler/trainer gap: rollout correction acts


@pytest.mark.parametrize("preset", ABLATABLE_PRESETS)
def test_each_variant_differs_from_the_full_preset_in_exactly_its_switch(preset):
    found, skipped = variants(preset, BF16, extra=OPTIONAL_TRICKS)
    assert found[0].name == "full" and found[0].overrides == {}
    full = leaves(to_dict(resolved(preset, BF16, found[0])))
    by_name = {t.name: t for t in TRICKS}
    for variant in found[1:]:
        differs = {k for k, v in leaves(to_dict(resolved(preset, BF16, variant))).items() if full[k] != v}
        assert differs == by_name[variant.trick].fields(), variant.name
        prefix = "no_" if variant.name.startswith("no_") else "with_"
        assert variant.name == prefix + variant.trick
    named = {v.trick for v in found[1:]} | {s["trick"] for s in skipped}
    assert named == set(by_name)  # every trick is a variant or skipped with its reason
    if preset in ("apa", "awr"):  # GSPO / CISPO replace the ppo loss, Clip-Cov / KL-Cov act on its tokens
        reasons = {s["trick"]: s["reason"] for s in skipped}
        assert set(reasons) >= {"gspo", "cispo", "clip_cov", "kl_cov"}
        assert reasons["gspo"] == f"acts on the ppo loss only, and {preset} trains {preset}"
    else:
        new = {"with_gspo", "with_cispo", "with_clip_cov", "with_kl_cov", "with_rollout_correction"}
        assert new <= {v.name for v in found}
        config = {v.name: resolved(preset, BF16, v).policy for v in found}
        gspo, cispo = config["with_gspo"], config["with_cispo"]
        assert (gspo.loss, gspo.clip_eps, gspo.clip_eps_high) == ("gspo", 3e-4, 4e-4)  # GSPO paper §5.1
        assert (cispo.loss, cispo.clip_eps_high, cispo.cispo_clip_eps_low) == ("cispo", 4.0, None)


def test_rollout_correction_is_skipped_where_sampler_and_trainer_agree():
    found, skipped = variants("ppo_max", {**ABLATE_RL, "dtype": "float32"}, extra=("rollout_correction",))
    assert "with_rollout_correction" not in {v.name for v in found}
    assert {"trick": "rollout_correction", "reason": NO_MISMATCH} in skipped
    assert "float32" in NO_MISMATCH and "Fix: --rl.dtype bfloat16" in NO_MISMATCH


def test_an_arm_runs_its_own_preset_at_the_ablation_scale():
    assert set(ARM_SOURCES) == set(PRESETS)  # every preset can be an arm, with its reference
    settings = deep_merge(ABLATE_RL, {"critic": {"pretrain_iterations": 1}})  # a critic key, as TINY's
    (arm,) = arm_variants("ppo_max", settings, ("online_dpo", "online_dpo"))
    assert (arm.name, arm.preset, arm.trick) == ("arm_online_dpo", "online_dpo", None)
    assert "Guo et al. 2024 §3" in arm.source
    algorithm, layers = run_layers("ppo_max", settings, arm)
    config = load_config(RLConfig, preset=algorithm, overrides=layers)
    base = load_config(RLConfig, preset="ppo_max", overrides=settings)
    assert config.policy.loss == "online_dpo" and not config.uses_critic and config.kl.beta == 0.0
    assert config.rollout.samples_per_prompt == 2  # its own groups, as many responses as the base's
    assert config.rollout.batch_size * 2 == base.rollout.batch_size * base.rollout.samples_per_prompt
    assert config.policy_optim.lr == ABLATE_RL["policy_optim"]["lr"]  # the ablation's scale
    assert config.rollout.max_new_tokens == base.rollout.max_new_tokens
    (grpo,) = arm_variants("ppo_max", settings, ("grpo",))  # any preset: GRPO's groups of 8
    assert (
        load_config(
            RLConfig, preset="grpo", overrides=run_layers("ppo_max", settings, grpo)[1]
        ).rollout.batch_size
        == 8
    )
    with pytest.raises(ConfigError, match=r"--add-arm 'dpo' is not a preset\. Fix: one of vanilla_ppo"):
        arm_variants("ppo_max", settings, ("dpo",))
    with pytest.raises(ConfigError, match=r"--add-arm ppo_max is the ablated preset itself"):
        arm_variants("ppo_max", settings, ("ppo_max",))
    with pytest.raises(ConfigError, match=r"^--add-arm online_dpo: .*kl\.beta is 0\.1.*Fix: --kl\.beta 0"):
        arm_variants("ppo_max", deep_merge(settings, {"kl": {"beta": 0.1}}), ("online_dpo",))


@pytest.mark.slow  # a stage and two runs: ~8 s
def test_one_cell_of_an_arm_and_of_a_new_loss(tmp_path):
    """The grid's cells of arm_online_dpo and with_gspo, one seed each, over a stage built once."""
    torch.set_num_threads(1)
    cfg = demo_config(None, [*TINY, "--iterations", "1"])
    stage = prepare_stage(cfg, tmp_path, say=lambda *a: None, quiet=True)
    settings = deep_merge(ABLATE_RL, cfg.rl)
    cfg.rl = {}
    cells = [
        *arm_variants("ppo_max", settings, ("online_dpo",)),
        variants("ppo_max", settings, extra=("gspo",))[0][-1],
    ]
    marks = {
        "arm_online_dpo": ("loss: online_dpo", "online_dpo/margin"),
        "with_gspo": ("loss: gspo", "policy/loss"),
    }
    for variant in cells:
        _, summary = run_one_variant(cfg, stage, "ppo_max", settings, variant, 0, tmp_path)
        assert [t["iteration"] for t in summary["trajectory"]] == [0, 1]  # the SFT policy, then after one
        run_dir = tmp_path / "runs" / f"{variant.name}-seed0"
        written, metric = marks[variant.name]
        assert written in (run_dir / "config.yaml").read_text()
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        (record,) = [json.loads(x) for x in lines if '"iteration"' in x and '"event"' not in x]
        assert math.isfinite(record[metric]) and math.isfinite(record["policy/loss"])


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
