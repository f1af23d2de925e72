"""policy.loss choices are the loss registry's names, and every parameter a registered loss reads
is a field of PolicyLossConfig."""

from __future__ import annotations

import dataclasses

import pytest

from rlhf.config import ConfigError, PolicyLossConfig, RLConfig, load_config
from rlhf.core import POLICY_LOSS_SOURCES, POLICY_LOSSES, policy_loss_params, register_policy_loss


@pytest.mark.parametrize("name", ["ppo", "apa", "awr"])
def test_every_parameter_of_a_built_in_loss_is_a_policy_loss_config_field(name):
    fields = {f.name: f.default for f in dataclasses.fields(PolicyLossConfig)}
    assert set(POLICY_LOSS_SOURCES[name].values()) <= set(fields)
    params = policy_loss_params(name, PolicyLossConfig())
    assert params == {param: fields[attribute] for param, attribute in POLICY_LOSS_SOURCES[name].items()}


def test_an_unknown_loss_names_the_registry_choices():
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    assert "policy.loss must be one of 'ppo', 'apa', 'awr', got 'dpo'" in str(error.value)


def test_a_loss_registered_later_is_a_valid_choice():
    @register_policy_loss("test_later", sources={"clip_eps": "clip_eps"})
    def later(logp, old_logp, ref_logp, advantages, mask, *, clip_eps: float = 0.2):  # type: ignore[no-untyped-def]
        return logp.sum(), {}

    try:
        config = load_config(RLConfig, overrides={"policy": {"loss": "test_later", "clip_eps": 0.3}})
        assert policy_loss_params(config.policy.loss, config.policy) == {"clip_eps": 0.3}
        with pytest.raises(ConfigError, match="one of 'ppo', 'apa', 'awr', 'test_later', got 'dpo'"):
            load_config(RLConfig, overrides={"policy": {"loss": "dpo"}})
    finally:
        POLICY_LOSSES.pop("test_later")
        POLICY_LOSS_SOURCES.pop("test_later")
    with pytest.raises(ConfigError, match="got 'test_later'"):
        load_config(RLConfig, overrides={"policy": {"loss": "test_later"}})
