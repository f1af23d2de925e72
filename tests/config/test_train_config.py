"""Configuration as the trainers see it: every switch of docs/algorithms.md is a field, presets load,
and mistakes name the key, where it came from and the fix."""

from __future__ import annotations

import pytest

from rlhf.config import (
    PRESETS,
    ConfigError,
    RLConfig,
    config_from_yaml,
    load_config,
    parse_overrides,
    save_config,
)

# Every switch docs/algorithms.md names, with a non-default value (the behaviour of each is tested in
# tests/rl: test_reward_switches.py, test_update_switches.py, test_update_math.py and test_resume.py).
SWITCHES = {
    "reward.scale": True,
    "reward.normalize": True,
    "reward.clip": 5.0,
    "reward.discounted": True,
    "kl.beta": 0.1,
    "kl.estimator": "k3",
    "kl.adaptive": True,
    "advantage.whiten": False,
    "advantage.clip": 0.5,
    "advantage.lam": 1.0,
    "advantage.gamma": 0.99,
    "policy.loss": "apa",
    "policy.clip_eps": 0.1,
    "policy.dual_clip": 3.0,
    "policy.ratio_against": "ref",
    "policy.entropy_coef": 0.01,
    "policy.ptx_coef": 0.5,
    "critic.value_clip": 0.5,
    "critic.pretrain_iterations": 5,
    "model.critic_init": "policy",
    "model.critic_mode": "shared",
    "policy_optim.max_grad_norm": 0.5,
    "train.buffer_size": 4,
    "train.ppo_epochs": 2,
    "train.minibatches": 2,
    "rollout.truncated": "penalize",
    "model.lora.enabled": True,
}


def nested(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    *groups, last = dotted.split(".")
    for group in groups:
        node = node.setdefault(group, {})
    node[last] = value
    return out


def get(config, dotted: str):
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("key", sorted(SWITCHES))
def test_every_switch_is_an_independent_field(key):
    value = SWITCHES[key]
    overrides = nested(key, value)
    if key == "reward.discounted":
        overrides = {"reward": {"discounted": True, "scale": True}}
    config = load_config(RLConfig, overrides=overrides)
    assert get(config, key) == value
    assert get(RLConfig(), key) != value  # the default differs: the override is what set it


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_load_and_round_trip_through_yaml(preset, tmp_path):
    config = load_config(RLConfig, preset=preset)
    assert config.preset == preset
    save_config(config, tmp_path / "config.yaml")
    assert config_from_yaml(RLConfig, tmp_path / "config.yaml") == config


def test_presets_differ_as_the_papers_say():
    vanilla, ppo_max = load_config(RLConfig, preset="vanilla_ppo"), load_config(RLConfig, preset="ppo_max")
    apa, awr = load_config(RLConfig, preset="apa"), load_config(RLConfig, preset="awr")
    assert (vanilla.kl.beta, vanilla.reward.normalize, vanilla.critic.value_clip) == (0.0, False, None)
    # PPO paper §5.1: every run's critic starts from the reward model, pre-training is PPO-max's
    assert vanilla.policy_optim.max_grad_norm is None and vanilla.model.critic_init == "reward_model"
    assert vanilla.critic.pretrain_iterations == 0
    assert ppo_max.reward.normalize and ppo_max.reward.clip == 10.0 and ppo_max.kl.beta > 0
    assert ppo_max.critic.pretrain_iterations > 0 and ppo_max.model.critic_init == "reward_model"
    assert ppo_max.policy_optim.max_grad_norm == 1.0 and ppo_max.critic.value_clip == 0.2
    assert not ppo_max.advantage.whiten and ppo_max.train.minibatches == 4  # PPO paper §5.4; 128 / 32 (§5.1)
    assert (apa.policy.loss, awr.policy.loss) == ("apa", "awr")
    # APA and AWR as the APA authors' code: no KL penalty in the reward, whitened advantages
    for other in (apa, awr):
        assert other.kl.beta == 0.0 and other.advantage.whiten and other.train.ppo_epochs == 2
        # and PPO-max's score processing, so a comparison isolates the policy loss
        assert other.reward == ppo_max.reward
    assert (apa.policy.apa_lam, awr.policy.awr_lam, awr.policy.awr_max_weight) == (0.1, 2.0, None)
    grpo, rloo, rpp = (load_config(RLConfig, preset=name) for name in ("grpo", "rloo", "reinforce_pp"))
    assert not any(c.uses_critic for c in (grpo, rloo, rpp))
    # GRPO: KL as k3 in the loss, none in the reward (DeepSeekMath eq. 3, beta 0.04)
    assert (grpo.kl.beta, grpo.policy.kl_loss_coef, grpo.policy.kl_loss_estimator) == (0.0, 0.04, "k3")
    # RLOO and REINFORCE++: KL in the reward, none in the loss
    assert rloo.kl.beta > 0 and rpp.kl.beta > 0 and rloo.policy.kl_loss_coef == rpp.policy.kl_loss_coef == 0
    assert grpo.rollout.samples_per_prompt >= 2 and rloo.rollout.samples_per_prompt >= 2
    assert not (grpo.advantage.whiten or rloo.advantage.whiten or rpp.advantage.whiten)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kl": {"betta": 0.1}}, "unknown key 'kl.betta'. Did you mean 'kl.beta'?"),
        ({"polcy": {"loss": "apa"}}, "unknown key 'polcy'. Did you mean 'policy'?"),
        ({"train": {"iterations": "ten"}}, "train.iterations must be an integer >= 0, got 'ten'"),
        ({"train": {"iterations": 2.5}}, "train.iterations must be an integer"),
        ({"reward": {"normalize": "yes"}}, "reward.normalize must be true or false"),
        ({"kl": {"beta": "big"}}, "kl.beta must be a number"),
        ({"kl": {"estimator": "k4"}}, "kl.estimator must be one of 'k1', 'k2', 'k3', got 'k4'"),
        ({"policy": {"loss": "dpo"}}, "policy.loss must be one of 'ppo', 'apa', 'awr'"),
        ({"rollout": {"truncated": "cut"}}, "rollout.truncated must be one of 'keep', 'penalize', 'drop'"),
        ({"policy_optim": {"schedule": "step"}}, "policy_optim.schedule must be one of"),
        ({"kl": 0.1}, "command line: kl must be a mapping, got 0.1"),
        ({"kl": {"adaptive": True, "beta": 0.0}}, "kl.adaptive needs kl.beta > 0"),
        ({"policy": {"dual_clip": 0.5}}, "policy.dual_clip must be > 1"),
        ({"train": {"buffer_size": 0}}, "train.buffer_size must be >= 1"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, preset="ppo_max", overrides=overrides)
    assert message in str(error.value)


def test_errors_in_a_config_file_name_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("kl:\n  estimator: k9\n")
    with pytest.raises(ConfigError, match=f"{path}: kl.estimator must be one of"):
        load_config(RLConfig, file=str(path))
    path.write_text("kl: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RLConfig, file=str(path))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(RLConfig, file=str(tmp_path / "missing.yaml"))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError, match="unknown preset 'ppo_min'.*vanilla_ppo, ppo_max, apa, awr"):
        load_config(RLConfig, preset="ppo_min")


def test_layering_order_defaults_preset_file_flags(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("kl: {beta: 0.2, estimator: k2}\n")
    overrides = parse_overrides(["--kl.beta", "0.3", "--train.iterations=7"])
    config = load_config(RLConfig, preset="ppo_max", file=str(path), overrides=overrides)
    assert (config.kl.beta, config.kl.estimator, config.train.iterations) == (0.3, "k2", 7)
    assert config.reward.normalize  # from the preset
    assert config.rollout.top_p == 1.0  # a default


def test_exponent_notation_is_a_number_on_the_command_line():
    config = load_config(
        RLConfig, overrides=parse_overrides(["--policy_optim.lr", "1e-3", "--kl.beta", "5e-2"])
    )
    assert (config.policy_optim.lr, config.kl.beta) == (1e-3, 5e-2)


def test_parse_overrides_values_and_errors():
    assert parse_overrides(["--reward.clip", "null", "--log.sinks", "jsonl,console"]) == {
        "reward": {"clip": None},
        "log": {"sinks": "jsonl,console"},
    }
    with pytest.raises(ConfigError, match="--kl.beta needs a value"):
        parse_overrides(["--kl.beta"])
    with pytest.raises(ConfigError, match="unexpected argument 'beta'"):
        parse_overrides(["beta", "0.1"])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        pytest.param({"reward": {"discounted": True}}, "reward.scale"),
        pytest.param({"reward": {"clip": -1.0}}, "reward.clip"),
        pytest.param({"advantage": {"clip": 0.0}}, "advantage.clip"),
        pytest.param({"advantage": {"lam": 1.5}}, "advantage.lam"),
        pytest.param({"critic": {"value_clip": 0.0}}, "critic.value_clip"),
        pytest.param({"policy": {"clip_eps": 0.0}}, "policy.clip_eps"),
        pytest.param({"policy": {"apa_lam": 0.0}}, "policy.apa_lam"),
        pytest.param({"kl": {"adaptive": True, "horizon": 4}}, "kl.horizon"),
        pytest.param({"train": {"ppo_epochs": 0}}, "train.ppo_epochs"),
        pytest.param({"rollout": {"max_new_tokens": 0}}, "rollout.max_new_tokens"),
    ],
)
def test_out_of_range_values_stop_at_load_time(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(RLConfig, overrides=overrides)


def test_rollout_sampling_paper_samples_with_the_papers_three_values():
    """PPO paper §6.1: temperature 0.8, top-p 0.9, repetition penalty 1.1, for rollouts too."""
    from rlhf.config import ConfigError, rollout_sampling
    from rlhf.models.sampling import SamplingConfig

    paper = SamplingConfig.ppo_paper()
    expected = {
        "temperature": paper.temperature,
        "top_p": paper.top_p,
        "repetition_penalty": paper.repetition_penalty,
    }
    config = load_config(RLConfig, preset="ppo_max", overrides={"rollout": {"sampling": "paper"}})
    assert rollout_sampling(config.rollout) == expected
    same = load_config(RLConfig, overrides={"rollout": {"sampling": "paper", "temperature": 0.8}})
    assert rollout_sampling(same.rollout) == expected  # naming the paper's own value is fine
    with pytest.raises(ConfigError, match="rollout.sampling paper samples with temperature 0.8, but"):
        load_config(RLConfig, overrides={"rollout": {"sampling": "paper", "temperature": 0.7}})
    with pytest.raises(ConfigError, match="rollout.sampling must be one of 'custom', 'paper'"):
        load_config(RLConfig, overrides={"rollout": {"sampling": "ppo"}})
    custom = load_config(RLConfig, overrides={"rollout": {"temperature": 0.7}})
    assert rollout_sampling(custom.rollout) == {"temperature": 0.7, "top_p": 1.0, "repetition_penalty": 1.0}


def test_entropy_target_settings_are_checked():
    from rlhf.config import ConfigError

    config = load_config(RLConfig, overrides={"policy": {"entropy_coef": 0.01, "entropy_target": 2.0}})
    assert (config.policy.entropy_target, config.policy.entropy_clip) == (2.0, 0.0)
    assert load_config(RLConfig).policy.entropy_target is None  # off by default: the plain bonus
    with pytest.raises(ConfigError, match="policy.entropy_clip must be >= 0"):
        load_config(RLConfig, overrides={"policy": {"entropy_target": 2.0, "entropy_clip": -1.0}})
    with pytest.raises(
        ConfigError, match="policy.entropy_clip applies only when policy.entropy_target is set"
    ):
        load_config(RLConfig, overrides={"policy": {"entropy_clip": 0.5}})
