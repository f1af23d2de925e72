"""One short run of each preset: finite losses, moving parameters, every monitor present and sane."""

from __future__ import annotations

import math

import pytest

from rlhf.config import PRESETS, RLConfig, load_config
from rlhf.models.loading import load_causal_lm
from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.train_testing import MAX_NEW_TOKENS, metric_rows, params_of, rl_config

# Monitors of docs/algorithms.md §22 that every algorithm logs each iteration.
COMMON = (
    "reward/raw_mean",
    "reward/raw_std",
    "reward/processed_mean",
    "kl/ref",
    "kl/k3",
    "kl/beta",
    "policy_ppl",
    "ref_ppl",
    "response/length_mean",
    "response/length_max",
    "response/eos_rate",
    "response/distinct2",
    "advantage/mean",
    "return/mean",
    "policy/loss",
    "policy/entropy",
    "policy/approx_kl",
    "policy/lr",
    "collapse",
)
# Monitors of a run with a critic (gae), absent from critic-free runs.
CRITIC = ("value/loss", "value/explained_variance", "value/value_clip_fraction", "value/lr", "value/mean")
GROUPS = ("group/reward_std", "group/zero_std_fraction")  # runs with samples_per_prompt > 1
# Critic-free presets run with 8 responses per rollout too: 4 prompts x 2 where they need groups.
SMALL_GROUPS = {"rollout": {"batch_size": 4, "samples_per_prompt": 2}}
PER_LOSS = {
    "ppo": ("policy/clip_fraction", "policy/ratio_mean", "policy/ratio_min", "policy/ratio_max"),
    "apa": ("policy/log_ratio_ref_mean", "policy/residual_abs_mean"),
    "awr": ("policy/weight_mean", "policy/weight_max", "policy/weight_clip_fraction"),
    "gspo": ("policy/clip_fraction", "policy/ratio_mean", "policy/ratio_min", "policy/ratio_max"),
    "cispo": ("policy/weight_clip_fraction", "policy/clip_fraction_high", "policy/ratio_mean"),
    "online_dpo": (
        "online_dpo/tie_fraction",
        "online_dpo/score_gap",
        "online_dpo/accuracy",
        "online_dpo/margin",
    ),
}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_with_sane_metrics(preset, make_trainer, tmp_path):
    uses_critic = load_config(RLConfig, preset=preset).uses_critic
    if uses_critic:
        config = rl_config(preset, critic={"pretrain_iterations": 1})
    else:
        config = rl_config(preset, SMALL_GROUPS if preset != "reinforce_pp" else {})
    trainer = make_trainer(config, run_dir=tmp_path / preset)
    policy_before = params_of(trainer.runtime.roles.policy.model)
    critic_before = params_of(trainer.runtime.roles.critic.model) if uses_critic else {}
    trainer.train()

    for name, param in trainer.runtime.roles.policy.model.named_parameters():
        assert not param.detach().equal(policy_before[name]), f"{name} did not move"
    if uses_critic:
        assert any(
            not p.detach().equal(critic_before[n])
            for n, p in trainer.runtime.roles.critic.model.named_parameters()
        )
    else:
        assert trainer.runtime.roles.critic is None
    expected = COMMON + PER_LOSS[config.policy.loss] + (CRITIC if uses_critic else ())
    expected += GROUPS if config.rollout.samples_per_prompt > 1 else ()

    rows = metric_rows(tmp_path / preset, kinds=("iteration",))
    assert [r["iteration"] for r in rows] == [0, 1]
    for row in rows:
        missing = [k for k in expected if k not in row]
        assert not missing, f"{preset}: metrics missing {missing}"
        if not uses_critic:
            assert not [k for k in row if k.startswith("value/")], (
                f"{preset}: critic monitors without a critic"
            )
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), f"{preset}: {key} = {value}"
        assert 0.0 <= row["response/eos_rate"] <= 1.0
        assert 0.0 <= row["response/distinct2"] <= 1.0
        assert row["policy_ppl"] >= 1.0 and row["ref_ppl"] >= 1.0
        assert 1.0 <= row["response/length_mean"] <= row["response/length_max"] <= MAX_NEW_TOKENS
        assert row["kl/k3"] >= 0.0  # k3 is non-negative per token
        if uses_critic:
            assert row["value/loss"] >= 0.0
            assert 0.0 <= row["value/value_clip_fraction"] <= 1.0
        assert row["policy/entropy"] > 0.0
        assert len(row["reward/raw_scores"]) == config.rollout.batch_size * config.rollout.samples_per_prompt
        if config.policy.kl_loss_coef > 0:
            assert row["policy/kl_loss"] >= 0.0  # k3 is non-negative per token
        if "group/zero_std_fraction" in row:
            assert 0.0 <= row["group/zero_std_fraction"] <= 1.0 and row["group/reward_std"] >= 0.0
        if config.policy.loss in ("ppo", "gspo"):  # gspo's per response
            assert 0.0 <= row["policy/clip_fraction"] <= 1.0
            assert 0.0 < row["policy/ratio_min"] <= row["policy/ratio_mean"] <= row["policy/ratio_max"]
        if config.policy.loss == "awr":
            cap = config.policy.awr_max_weight  # None (uncapped, as the APA code): no weight is clipped
            assert 0.0 < row["policy/weight_mean"] <= row["policy/weight_max"] <= (cap or math.inf)
            assert 0.0 <= row["policy/weight_clip_fraction"] <= (1.0 if cap else 0.0)
        if config.kl.beta == 0:
            assert row["kl/beta"] == 0.0

    pretrain = metric_rows(tmp_path / preset, kinds=("pretrain",))
    assert [r["pretrain"] for r in pretrain] == ([0] if uses_critic else [])
    if uses_critic:
        assert math.isfinite(pretrain[0]["critic_pretrain/value_loss"])


def test_run_directory_holds_config_checkpoint_and_loadable_models(make_trainer, tmp_path, capfd):
    run = tmp_path / "run"
    make_trainer(rl_config("ppo_max", train={"iterations": 1}), run_dir=run).train()
    assert "Writing model shards" not in capfd.readouterr().err  # no progress bars from HF saves
    assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["iter_000001"]
    policy = load_causal_lm(run)
    critic = ScalarHeadModel.from_pretrained(run / "critic")
    assert policy.config.vocab_size == critic.config.vocab_size
