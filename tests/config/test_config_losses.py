"""policy.loss choices are the loss registry's names; the PolicyLossConfig fields a registered loss
reads are those its `settings` function reads, and a field the chosen loss does not read is refused."""

from __future__ import annotations

import dataclasses

import pytest

from rlhf.config import ConfigError, PolicyLossConfig, RLConfig, load_config
from rlhf.config.registry_reads import attributes_read
from rlhf.core import POLICY_LOSSES, policy_loss_params, register_policy_loss

READS = {
    "ppo": {"clip_eps", "clip_eps_high", "dual_clip", "ratio_against"},
    "apa": {"apa_lam"},
    "awr": {"awr_lam", "awr_max_weight"},
    "gspo": {"clip_eps", "clip_eps_high"},
    "cispo": {"clip_eps_high", "cispo_clip_eps_low"},
    "online_dpo": set(),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_every_setting_a_built_in_loss_reads_is_a_policy_loss_config_field(name):
    fields = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    assert attributes_read(POLICY_LOSSES[name].settings, PolicyLossConfig()) == READS[name]
    assert READS[name] <= fields
    config = PolicyLossConfig(clip_eps=0.11, apa_lam=0.44, awr_lam=5.5, cispo_clip_eps_low=0.66)
    assert set(policy_loss_params(name, config).values()) == {getattr(config, f) for f in READS[name]}


def test_an_unknown_loss_names_the_registry_choices():
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    assert "policy.loss must be one of 'ppo', 'apa', 'awr', 'cispo', 'gspo', 'online_dpo', got 'dpo'" in str(
        error.value
    )


def test_a_loss_registered_later_is_a_valid_choice_and_its_settings_say_which_keys_apply():
    @register_policy_loss("test_later", settings=lambda c: {"clip_eps": c.clip_eps})
    def later(logp, old_logp, ref_logp, advantages, mask, *, clip_eps: float = 0.2):  # type: ignore[no-untyped-def]
        return logp.sum(), {}

    try:
        config = load_config(RLConfig, overrides={"policy": {"loss": "test_later", "clip_eps": 0.3}})
        assert policy_loss_params(config.policy.loss, config.policy) == {"clip_eps": 0.3}
        with pytest.raises(ConfigError, match=r"policy.apa_lam .*policy.loss is one that reads it \(apa\)"):
            load_config(RLConfig, overrides={"policy": {"loss": "test_later", "apa_lam": 0.3}})
        with pytest.raises(
            ConfigError,
            match="one of 'ppo', 'apa', 'awr', 'cispo', 'gspo', 'online_dpo', 'test_later', got 'dpo'",
        ):
            load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    finally:
        POLICY_LOSSES.pop("test_later")
    with pytest.raises(ConfigError, match="got 'test_later'"):
        load_config(RLConfig, overrides={"policy": {"loss": "test_later"}})


@pytest.mark.parametrize(
    "overrides,key,fix",
    [
        ({"policy": {"loss": "cispo"}}, "policy.clip_eps_high", "--policy.clip_eps_high 4.0"),
        ({"policy": {"loss": "gspo", "loss_aggregation": "fixed_length"}}, "policy.loss_aggregation",
         "--policy.loss_aggregation token_mean"),
        ({"policy": {"loss": "apa", "cov_control": "kl_cov"}}, "policy.cov_control", "--policy.loss ppo"),
        ({"policy": {"cov_control": "kl_cov", "cov_ratio": 0.0}}, "policy.cov_ratio", "--policy.cov_ratio 0.0002"),
        ({"policy": {"cov_ratio": 0.01}}, "policy.cov_ratio", "--policy.cov_control clip_cov"),
        ({"policy": {"loss": "cispo", "clip_eps_high": 4.0, "cispo_clip_eps_low": 1.5}},
         "policy.cispo_clip_eps_low", "--policy.cispo_clip_eps_low 1.0"),
        ({"policy": {"cispo_clip_eps_low": 0.5}}, "policy.cispo_clip_eps_low", "--policy.loss cispo"),
        ({"rollout": {"correction": {"enabled": True, "cap": 1.0}}}, "rollout.correction.cap",
         "--rollout.correction.cap 2.0"),
        ({"rollout": {"correction": {"cap": 3.0}}}, "rollout.correction.cap", "--rollout.correction.enabled true"),
        ({"rollout": {"correction": {"enabled": True}, "logprobs_from_sampler": True}},
         "rollout.correction.enabled", "--rollout.logprobs_from_sampler false"),
    ],
)  # fmt: skip
def test_new_loss_and_correction_settings_are_refused_with_the_key_and_the_fix(overrides, key, fix):
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, overrides=overrides)
    assert key in str(error.value) and fix in str(error.value)


@pytest.mark.parametrize("preset", ["gspo", "cispo"])
def test_the_new_presets_load_with_the_papers_values(preset):
    config = load_config(RLConfig, preset=preset)
    assert config.policy.loss == preset and config.advantage.estimator == "grpo" and not config.uses_critic
    assert (config.policy.clip_eps, config.policy.clip_eps_high)[preset == "cispo" :] == (
        (3e-4, 4e-4) if preset == "gspo" else (4.0,)
    )
