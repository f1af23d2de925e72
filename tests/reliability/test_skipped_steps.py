"""A run whose every optimizer step is skipped for NaN/inf gradients stops after 3 in a row, naming the
settings that scale its loss (rlhf/train/guards.py `loss_scale_fix`), instead of running to its end
with weights that never change."""

from __future__ import annotations

import pytest

import rlhf.train.optimizer as optimizer
from rlhf.config import DPOConfig, RewardConfig, RLConfig, SFTConfig, load_config
from rlhf.train.guards import loss_scale_fix
from tests.support.reliability_testing import assert_user_error, rlhf_in_process


def test_the_fix_names_the_settings_that_scale_each_stage_loss():
    dpo = loss_scale_fix(load_config(DPOConfig, overrides={"dpo": {"beta": 50.0}}))
    assert "dpo.beta 50" in dpo and "optim.lr 1e-06" in dpo and "--dtype float32" in dpo
    simpo = loss_scale_fix(load_config(DPOConfig, overrides={"dpo": {"loss": "simpo"}}))
    assert "dpo.simpo_gamma" in simpo
    ppo = loss_scale_fix(load_config(RLConfig, preset="ppo_max"))
    for name in ("policy_optim.lr", "policy.clip_eps", "kl.beta", "critic_optim.lr", "reward.clip"):
        assert name in ppo
    assert "critic_optim.lr" not in loss_scale_fix(load_config(RLConfig, preset="grpo"))  # no critic
    assert "train.lm_coef" in loss_scale_fix(RewardConfig()) and "dpo.beta" not in loss_scale_fix(SFTConfig())


@pytest.mark.slow  # a tiny DPO run: ~2 s
def test_a_dpo_run_with_every_step_skipped_stops_after_three_naming_beta(
    files, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(optimizer, "is_finite_norm", lambda norm: False)  # every step's gradients non-finite
    out = tmp_path / "dpo"
    result = rlhf_in_process(capsys, "dpo", "--model", files["policy"], "--data", files["pairs"], "--out", out,
                             "--train.max_steps", "6", "--train.batch_size", "2", "--sinks", "jsonl",
                             "--train.eval_every", "0")  # fmt: skip
    message = assert_user_error(result, "skipped every optimizer step", "3 steps in a row", "dpo.beta 0.1")
    assert "(to step 2)" in message, message


@pytest.mark.parametrize("beta", ["1e30", "101"])
def test_a_dpo_beta_beyond_any_meaningful_scale_is_refused_before_the_run(beta, files, tmp_path, capsys):
    out = tmp_path / "dpo"
    result = rlhf_in_process(capsys, "dpo", "--model", files["policy"], "--data", files["pairs"], "--out", out,
                             "--dpo.beta", beta)  # fmt: skip
    assert_user_error(result, "dpo.beta must be in (0, 100]", "Fix: --dpo.beta 0.1")
    assert not out.exists()
