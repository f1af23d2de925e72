"""policy.loss choices are the loss registry's names, and every parameter a registered loss reads
is a field of PolicyLossConfig."""

from __future__ import annotations

import dataclasses

import pytest

from rlhf.config import ConfigError, PolicyLossConfig, RLConfig, load_config
from rlhf.core import (
    POLICY_LOSS_SOURCES,
    POLICY_LOSS_UNITS,
    POLICY_LOSSES,
    policy_loss_params,
    register_policy_loss,
)


@pytest.mark.parametrize("name", ["ppo", "apa", "awr", "gspo", "cispo"])
def test_every_parameter_of_a_built_in_loss_is_a_policy_loss_config_field(name):
    fields = {f.name: f.default for f in dataclasses.fields(PolicyLossConfig)}
    assert set(POLICY_LOSS_SOURCES[name].values()) <= set(fields)
    params = policy_loss_params(name, PolicyLossConfig())
    assert params == {param: fields[attribute] for param, attribute in POLICY_LOSS_SOURCES[name].items()}


def test_an_unknown_loss_names_the_registry_choices():
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    assert "policy.loss must be one of 'ppo', 'apa', 'awr', 'cispo', 'gspo', 'online_dpo', got 'dpo'" in str(
        error.value
    )


def test_a_loss_registered_later_is_a_valid_choice():
    @register_policy_loss("test_later", sources={"clip_eps": "clip_eps"})
    def later(logp, old_logp, ref_logp, advantages, mask, *, clip_eps: float = 0.2):  # type: ignore[no-untyped-def]
        return logp.sum(), {}

    try:
        config = load_config(RLConfig, overrides={"policy": {"loss": "test_later", "clip_eps": 0.3}})
        assert policy_loss_params(config.policy.loss, config.policy) == {"clip_eps": 0.3}
        with pytest.raises(
            ConfigError,
            match="one of 'ppo', 'apa', 'awr', 'cispo', 'gspo', 'online_dpo', 'test_later', got 'dpo'",
        ):
            load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    finally:
        POLICY_LOSSES.pop("test_later")
        POLICY_LOSS_SOURCES.pop("test_later")
        POLICY_LOSS_UNITS.pop("test_later")
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
