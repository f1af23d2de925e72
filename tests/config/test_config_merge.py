"""Layering changes only what it names: a preset, a YAML file or a flag sets its keys, and every other
field keeps its stage default (the field's default_factory result, at every depth). Each test loops
over every key of every stage and reports all the keys that fail, not the first."""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing

import pytest
import yaml

import rlhf.config.presets
from rlhf.config import (
    CRITIC_KEYS,
    PRESETS,
    ConfigError,
    DPOConfig,
    EvalConfig,
    RewardConfig,
    RLConfig,
    RMEvalConfig,
    SFTConfig,
    choices,
    config_from_yaml,
    from_dict,
    load_config,
    parse_overrides,
    preset_dict,
    save_config,
    to_dict,
)
from rlhf.config.fields import is_group, type_hints
from rlhf.config.keys import meeting
from rlhf.demo.run import DemoConfig, demo_config

STAGES = (SFTConfig, RewardConfig, DPOConfig, RLConfig, EvalConfig, RMEvalConfig)
# The keys a stage has no default for (validation asks for them), set in every layering test.
REQUIRED = {
    EvalConfig: {"policy": "p", "baseline": "b", "judge": "j", "data.prompts": "x.jsonl"},
    RMEvalConfig: {"reward_model": "rm", "data.path": "pairs.jsonl"},
}
# Cross-field rules of `validate`: a key that cannot change alone, and what it needs beside it.
COMPANIONS = {
    "reward.discounted": {"reward.scale": True, "reward.normalize": False},
    "kl.adaptive": {"kl.beta": 0.05, "policy.loss": "ppo"},  # vanilla_ppo has beta 0; online DPO none
    "dist.offload": {"dist.strategy": "fsdp2"},  # offloads fsdp2's shards
    "dist.rollout_gather": {"dist.strategy": "fsdp2"},  # gathers fsdp2's shards per layer
    # samples on a Ray rollout group, corrected by decoupled PPO
    # (and without dynamic sampling, which samples again within an iteration: the dapo preset's)
    "rollout.max_staleness": {
        "dist.runtime": "ray",
        "ray.rollout.num_actors": 1,
        "policy.loss": "ppo",
        "rollout.dynamic_sampling": False,
    },
    # the first other choice is a group estimator with no critic (and so no critic pre-training);
    # online DPO reads the pairwise estimator's signs (the online_dpo preset)
    "advantage.estimator": {"rollout.samples_per_prompt": 2, "policy.loss": "ppo"},
    "rollout.dynamic_sampling": {"rollout.samples_per_prompt": 2},  # keeps groups of 2 or more responses
    "policy.cov_control": {"policy.loss": "ppo"},  # Clip-Cov / KL-Cov act on the ppo loss's tokens
    "policy.loss_aggregation": {"policy.loss": "ppo"},  # a token denominator (gspo's is rows)
    "policy.cispo_clip_eps_low": {"policy.loss": "cispo", "policy.clip_eps_high": 4.0},  # cispo needs its cap
    "reward.llm_judge.url": {"reward.llm_judge.model": "m"},  # a judge server needs the model to ask
    "llm_judge.url": {"llm_judge.model": "m"},
    "reward.weights": {"model.reward_model": "rm"},  # one weight per reward source
    # online DPO ranks the two responses of a prompt by the pairwise estimator's sign, KL-free
    "policy.loss=online_dpo": {
        "advantage.estimator": "pairwise",
        "rollout.samples_per_prompt": 2,
        "kl.beta": 0.0,
    },
    "kl.beta": {
        "policy.loss": "ppo"
    },  # a KL penalty in the reward: not with online DPO (the online_dpo preset)
    "rollout.samples_per_prompt": {
        "policy.loss": "ppo",
        "advantage.estimator": "grpo",
    },  # pairwise: groups of 2
}


def leaves(config, prefix: str = "") -> list[tuple[str, typing.Any, typing.Any]]:
    """(dotted key, type, value) of every non-group field of a config instance, at every depth."""
    out = []
    hints = type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if is_group(hints[f.name]):
            out += leaves(value, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, hints[f.name], value))
    return out


# Keys whose next value breaks a rule of their own: their other value.
OTHER = {
    "histogram_bins": 12,
    "reward.remote.url": "http://127.0.0.1:8000",
    "reward.llm_judge.url": "http://127.0.0.1:8000/v1",
    "llm_judge.url": "http://127.0.0.1:8000/v1",
    "reward.weights": [1.0],
    "device": "cpu",
    "train.device": "cpu",
    "rollout.correction.cap": 3.0,
    "policy.cispo_clip_eps_low": 0.5,
    "train.compile_backend": "aot_eager",
}  # even; a URL; a device name; a cap > 1; a bound in (0, 1]


def other_value(key: str, tp, value):
    """A valid value of type `tp` that differs from `value`."""
    if key in OTHER:
        return OTHER[key]
    allowed = choices(tp)
    if allowed is not None:
        return next(c for c in allowed if c != value)
    if typing.get_origin(tp) is typing.Annotated:
        return other_value(key, typing.get_args(tp)[0], value)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        if value is None:
            return {float: 2.0, int: 3, str: "x"}.get(inner, ["q_proj"])  # 2.0: a valid dual_clip too
        return other_value(key, inner, value)
    if tp is bool:
        return not value
    if tp is int:
        return value + 1
    if tp is float:
        return value * 0.5 if value else 0.25
    if tp is str:
        return value + "x"
    if typing.get_origin(tp) is list:
        return [*value, "x"]
    if typing.get_origin(tp) is tuple:
        return (0.8, 0.9)
    if tp is dict:
        return {"kl": {"beta": 0.1}}
    raise AssertionError(f"no other value for {key}: {tp}")


def nested(changes: dict) -> dict:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict = {}
    for dotted, value in changes.items():
        node = out
        *groups, last = dotted.split(".")
        for group in groups:
            node = node.setdefault(group, {})
        node[last] = value
    return out


def with_changes(plain: dict, changes: dict) -> dict:
    """A copy of the plain nested dict `plain` with the dotted `changes` set (tuples as lists)."""
    out = json.loads(json.dumps(plain))
    for dotted, value in changes.items():
        node = out
        *groups, last = dotted.split(".")
        for group in groups:
            node = node[group]
        node[last] = list(value) if isinstance(value, tuple) else value
    return out


def companions(cls, key: str) -> dict:
    """What `key` needs beside it: the cross-field rules' COMPANIONS, and the declared conditions under
    which it applies (rlhf.config.keys) with those conditions' own companions."""
    met = meeting(cls, key)
    found: dict = {}
    for condition, value in met.items():
        found.update(COMPANIONS.get(condition, {}))
        found.update(COMPANIONS.get(f"{condition}={value}", {}))  # a rule of one value of the condition
    return {**found, **met, **COMPANIONS.get(key, {})}


def one_change(cls, key: str) -> dict:
    tp, value = next((tp, v) for k, tp, v in leaves(cls()) if k == key)
    return {**REQUIRED.get(cls, {}), **companions(cls, key), key: other_value(key, tp, value)}


def from_flags(cls, changes: dict):
    flags = [arg for key, value in changes.items() for arg in (f"--{key}", json.dumps(value))]
    if cls is DemoConfig:
        return demo_config(None, flags)
    return load_config(cls, overrides=parse_overrides(flags))


def from_file(cls, changes: dict, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        yaml.safe_dump(nested({k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()}))
    )
    if cls is DemoConfig:
        return demo_config(str(path), [])
    return load_config(cls, file=str(path))


def failures(cls, build) -> list[str]:
    """Every key of `cls` whose one change, built by `build(changes)`, changes more or less than it."""
    failed = []
    for key, _, _ in leaves(cls()):
        changes = one_change(cls, key)
        try:
            got = to_dict(build(changes))
        except ConfigError as err:
            failed.append(f"{key}: {err}")
            continue
        if got != with_changes(to_dict(cls()), changes):
            failed.append(key)
    return failed


@pytest.mark.parametrize("cls", [*STAGES, DemoConfig], ids=lambda cls: cls.__name__)
def test_a_flag_changes_only_the_key_it_names(cls):
    assert failures(cls, lambda changes: from_flags(cls, changes)) == []


@pytest.mark.parametrize("cls", [*STAGES, DemoConfig], ids=lambda cls: cls.__name__)
def test_a_yaml_file_changes_only_the_key_it_names(cls, tmp_path):
    assert failures(cls, lambda changes: from_file(cls, changes, tmp_path)) == []


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_changes_only_its_keys_and_a_flag_over_it_only_its_own(preset, monkeypatch):
    parsed = preset_dict(preset)  # parsed once: pure-Python YAML would dominate the ~100 loads below
    monkeypatch.setattr(rlhf.config.presets, "preset_dict", lambda name: copy.deepcopy(parsed))
    preset_keys = {k: v for k, _, v in leaves(from_dict(RLConfig, preset_dict(preset)))}
    named = {k: v for k, v in preset_keys.items() if _named(preset_dict(preset), k)}
    expected = with_changes(to_dict(RLConfig()), {**named, "preset": preset})
    config = load_config(RLConfig, preset=preset)
    assert to_dict(config) == expected
    failed = []
    for key, tp, value in leaves(config):
        if not config.uses_critic and any(key.startswith(k) for k in CRITIC_KEYS):
            change = {key: other_value(key, tp, value)}
            with pytest.raises(
                ConfigError, match=f"{key} applies only when advantage.estimator uses a critic"
            ):
                load_config(RLConfig, preset=preset, overrides=nested(change))
            continue
        changes = {**companions(RLConfig, key), key: other_value(key, tp, value)}
        flagged = load_config(RLConfig, preset=preset, overrides=nested(changes))
        if to_dict(flagged) != with_changes(expected, changes):
            failed.append(key)
    assert failed == []


def _named(mapping: dict, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return False
        mapping = mapping[part]
    return True


def test_the_reported_cases_keep_their_stage_defaults():
    sft = load_config(SFTConfig, overrides={"optim": {"warmup_steps": 2}}).optim
    assert (sft.lr, sft.schedule, sft.warmup_steps) == (2e-5, "cosine", 2)
    rm = load_config(RewardConfig, overrides={"optim": {"warmup_steps": 2}}).optim
    assert (rm.lr, rm.schedule, rm.warmup_steps, rm.warmup_fraction) == (5e-6, "cosine", 2, 0.1)
    rl = load_config(
        RLConfig, overrides={"policy_optim": {"max_grad_norm": 0.5}, "critic_optim": {"betas": [0.9, 0.99]}}
    )
    assert (rl.policy_optim.lr, rl.critic_optim.lr, rl.policy_optim.max_grad_norm) == (1e-6, 2e-6, 0.5)
    deep = load_config(RLConfig, overrides=parse_overrides(["--log.collapse.kl_rise", "4"]))
    assert (
        deep.log.collapse.kl_rise == 4.0
        and deep.log.collapse.kl_floor == 0.5
        and deep.log.sinks == ["console", "jsonl"]
    )


def test_reward_model_defaults_are_the_papers_and_token_batch_bounds_are_checked():
    # PPO paper §4.2: lr 5e-6 warmed up over the first 10% of steps; token batches of 4 to 128 pairs
    rm = RewardConfig()
    assert (rm.optim.lr, rm.optim.warmup_fraction, rm.optim.warmup_steps) == (5e-6, 0.1, 0)
    assert (rm.train.min_batch, rm.train.max_batch) == (4, 128)
    with pytest.raises(ConfigError, match=r"train.max_batch \(3\) must be >= train.min_batch \(4\)"):
        load_config(RewardConfig, overrides={"train": {"batching": "tokens", "max_batch": 3}})
    with pytest.raises(ConfigError, match=r"train.max_batch applies only when train.batching tokens"):
        load_config(RewardConfig, overrides={"train": {"max_batch": 3}})
    with pytest.raises(ConfigError, match="train.min_batch must be >= 1"):
        load_config(RewardConfig, overrides={"train": {"batching": "tokens", "min_batch": 0}})


# The papers' rates (docs/algorithms.md §23): PPO paper §5.1 with a 10% warmup; the APA code's 1e-6.
PAPER_RATES = {
    "vanilla_ppo": (5e-7, 1.65e-6, 0.1),
    "ppo_max": (5e-7, 1.65e-6, 0.1),
    "apa": (1e-6, 1e-6, 0.0),
    "awr": (1e-6, 1e-6, 0.0),
    # critic-free presets state the policy's rate alone
    "grpo": (1e-6, None, 0.0),
    "rloo": (1e-6, None, 0.0),
    "reinforce_pp": (1e-6, None, 0.0),
    "dapo": (1e-6, None, 0.0),  # DAPO paper §4.1 (its 20-step warm-up: not set, as grpo's)
    "gspo": (1e-6, None, 0.0),  # GRPO's (the GSPO paper states no rate)
    "cispo": (1e-6, None, 0.0),  # GRPO's
    "online_dpo": (5e-7, None, 0.0),  # TRL's OnlineDPOConfig
}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_states_its_learning_rates(preset):
    stated = preset_dict(preset)
    config = load_config(RLConfig, preset=preset)
    policy_lr, critic_lr, warmup = PAPER_RATES[preset]
    assert stated["policy_optim"]["lr"] == config.policy_optim.lr == policy_lr
    assert config.policy_optim.warmup_fraction == warmup
    if config.uses_critic:
        assert stated["critic_optim"]["lr"] == config.critic_optim.lr == critic_lr
        assert config.critic_optim.warmup_fraction == warmup
    else:  # a critic-free preset names no critic setting
        assert not {"critic", "critic_optim"} & set(stated) and "critic_init" not in stated.get("model", {})


def test_rlhf_train_with_a_preset_resolves_its_rates(monkeypatch, tmp_path):
    import rlhf.stages.sft
    import rlhf.stages.train
    from rlhf.cli import main

    seen = []
    monkeypatch.setattr(rlhf.stages.train, "run_rl", lambda config, **_: seen.append(config))
    monkeypatch.setattr(rlhf.stages.sft, "run_sft", lambda config, **_: seen.append(config))
    paths = ["--policy", "p", "--reward-model", "r", "--prompts", "x.jsonl", "--out", str(tmp_path)]
    assert main(["train", "--preset", "ppo_max", *paths, "--policy_optim.warmup_steps", "3"]) == 0
    assert main(["sft", "--model", "m", "--data", "d.jsonl", "--optim.warmup_steps", "3"]) == 0
    rl, sft = seen
    assert (rl.policy_optim.lr, rl.critic_optim.lr, rl.policy_optim.warmup_steps) == (5e-7, 1.65e-6, 3)
    assert (rl.policy_optim.max_grad_norm, rl.preset) == (1.0, "ppo_max")
    assert (sft.optim.lr, sft.optim.schedule, sft.optim.warmup_steps) == (2e-5, "cosine", 3)


@pytest.mark.parametrize("cls", STAGES, ids=lambda cls: cls.__name__)
def test_a_saved_config_reads_back_exactly(cls, tmp_path):
    every_key_changed = {k: other_value(k, tp, v) for k, tp, v in leaves(cls())}
    for config in (cls(), from_dict(cls, nested(every_key_changed))):
        save_config(config, tmp_path / "config.yaml")
        again = config_from_yaml(cls, tmp_path / "config.yaml")
        assert again == config and repr(again) == repr(config)  # repr: 1 vs 1.0, tuple vs list
