"""A config field's choices come from its own type (Literal, or a registry named in Annotated), never
from its key; every rule of a group names the key, the value given and a fix; `dtype` is the one
precision key of every stage."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field

import pytest

from rlhf.config import (
    ConfigError,
    DPOConfig,
    EvalConfig,
    OptimConfig,
    RewardConfig,
    RLConfig,
    RMEvalConfig,
    SFTConfig,
    choices,
    deep_merge,
    from_dict,
    load_config,
    parse_overrides,
)
from rlhf.config.fields import AdvantageEstimator, DataFormat, Dtype, PolicyLossName, is_group, type_hints
from rlhf.config.keys import meeting
from rlhf.core.advantages import ESTIMATORS
from rlhf.core.losses import POLICY_LOSSES
from rlhf.data.formats import FORMATS
from rlhf.models.precision import PRECISIONS

STAGES = (SFTConfig, RewardConfig, DPOConfig, RLConfig, EvalConfig, RMEvalConfig)
REQUIRED = {
    EvalConfig: {"policy": "p", "baseline": "b", "judge": "j", "data": {"prompts": "x.jsonl"}},
    RMEvalConfig: {"reward_model": "rm", "data": {"path": "pairs.jsonl"}},
}


def choice_fields(cls, prefix: str = ""):
    """(dotted key, allowed values) of every choice field of `cls`, at every depth."""
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if is_group(tp):
            yield from choice_fields(tp, f"{prefix}{f.name}.")
        elif choices(tp) is not None:
            yield f"{prefix}{f.name}", choices(tp)


def nested(dotted: str, value) -> dict:
    *groups, last = dotted.split(".")
    out: dict = {last: value}
    for group in reversed(groups):
        out = {group: out}
    return out


def test_every_choice_field_refuses_a_value_outside_its_own_type_and_names_its_choices():
    failed = []
    for cls in STAGES:
        for key, allowed in choice_fields(cls):
            try:
                load_config(cls, overrides=deep_merge(REQUIRED.get(cls, {}), nested(key, "nonsense")))
                failed.append(f"{cls.__name__} {key}: accepted")
            except ConfigError as err:
                listed = ", ".join(repr(c) if isinstance(c, str) else str(c).lower() for c in allowed)
                if f"{key} must be one of {listed}, got 'nonsense'. Fix: --{key} " not in str(err):
                    failed.append(f"{cls.__name__} {key}: {err}")
    assert failed == []
    # the fields the old key-suffix table named are all still choice fields
    rl = dict(choice_fields(RLConfig))
    assert rl["policy_optim.schedule"] == rl["critic_optim.schedule"] == ("constant", "cosine", "linear")
    assert rl["kl.estimator"] == rl["policy.kl_loss_estimator"] == ("k1", "k2", "k3")
    assert rl["data.chat_template"] == ("auto", True, False) and rl["dtype"] == PRECISIONS


@dataclass
class Other:
    schedule: str = "mine"  # a plain string: any value


@dataclass
class Stage:
    optim: OptimConfig = field(default_factory=OptimConfig)
    my_optim: Other = field(default_factory=Other)
    dtype_note: str = ""


def test_a_key_that_ends_like_a_choice_key_takes_no_choices_from_it():
    config = from_dict(Stage, {"my_optim": {"schedule": "step"}, "dtype_note": "anything"})
    assert (config.my_optim.schedule, config.dtype_note) == ("step", "anything")
    with pytest.raises(ConfigError, match="optim.schedule must be one of 'constant', 'cosine', 'linear'"):
        from_dict(Stage, {"optim": {"schedule": "step"}})


def test_shared_choice_types_are_the_choices_of_the_code_that_reads_them():
    assert typing.get_args(Dtype) == PRECISIONS  # rlhf.models.precision
    assert typing.get_args(DataFormat) == ("auto", *FORMATS)  # rlhf.data.loading accepts these
    assert choices(AdvantageEstimator) == tuple(ESTIMATORS)  # the registries, read when checked
    assert choices(PolicyLossName) == tuple(POLICY_LOSSES)


# (stage, dotted key, a bad value): one per rule of each group, through the command line's parser.
BAD = [
    (SFTConfig, "optim.betas", "[0.9,1.5]"),
    (SFTConfig, "optim.weight_decay", "-0.1"),
    (SFTConfig, "optim.warmup_fraction", "1.0"),
    (SFTConfig, "optim.min_lr_ratio", "2.0"),
    (SFTConfig, "optim.max_grad_norm", "0"),
    (SFTConfig, "dist.timeout", "0"),
    (SFTConfig, "train.eval_every", "-1"),
    (SFTConfig, "data.max_prompt_tokens", "0"),
    (RewardConfig, "train.min_batch", "0"),
    (RewardConfig, "data.test_fraction", "-0.5"),
    (DPOConfig, "dpo.beta", "0"),
    (DPOConfig, "dpo.label_smoothing", "1.5"),
    (RLConfig, "rollout.top_p", "1.5"),
    (RLConfig, "rollout.temperature", "0"),
    (RLConfig, "rollout.repetition_penalty", "0"),
    (RLConfig, "rollout.samples_per_prompt", "0"),
    (RLConfig, "reward.discount_gamma", "1.0"),
    (RLConfig, "reward.clip", "-1"),
    (RLConfig, "kl.beta", "-0.1"),
    (RLConfig, "kl.target", "0"),
    (RLConfig, "kl.horizon", "0"),
    (RLConfig, "advantage.gamma", "1.5"),
    (RLConfig, "advantage.group_eps", "-1"),
    (RLConfig, "policy.awr_lam", "0"),
    (RLConfig, "policy.awr_max_weight", "0"),
    (RLConfig, "policy.entropy_target", "-1"),
    (RLConfig, "policy.ptx_coef", "-1"),
    (RLConfig, "policy.kl_loss_coef", "-1"),
    (RLConfig, "critic.pretrain_iterations", "-1"),
    (RLConfig, "critic.pretrain_min_delta", "-1"),
    (RLConfig, "model.value_coef", "-1"),
    (RLConfig, "data.ptx_batch_size", "0"),
    (RLConfig, "log.eval_every", "-1"),
    (RLConfig, "log.samples_to_log", "-1"),
    (RLConfig, "log.collapse.patience", "0"),
    (RLConfig, "dist.timeout", "-5"),
    (RLConfig, "critic_optim.lr", "0"),
    (RLConfig, "train.micro_batch_size", "0"),
    (EvalConfig, "data.n", "0"),
    (EvalConfig, "rollout.top_p", "0"),
    (EvalConfig, "rollout.temperature", "-1"),
    (EvalConfig, "rollout.max_new_tokens", "0"),
    (RMEvalConfig, "batch_size", "0"),
    (RMEvalConfig, "worst", "-1"),
    (RMEvalConfig, "n", "-1"),
    (RMEvalConfig, "calibration_bins", "0"),
    (RMEvalConfig, "data.max_response_tokens", "0"),
]


def test_every_rule_names_the_key_the_value_and_a_fix():
    failed = []
    for cls, key, raw in BAD:
        overrides = parse_overrides([f"--{key}", raw])
        value = overrides
        for part in key.split("."):
            value = value[part]
        needs = parse_overrides([f"--{k}={json.dumps(v)}" for k, v in meeting(cls, key).items()])
        try:
            load_config(cls, overrides=deep_merge(deep_merge(REQUIRED.get(cls, {}), needs), overrides))
            failed.append(f"{cls.__name__} {key} {raw}: accepted")
            continue
        except ConfigError as err:
            message = str(err)
        shown = repr(list(value) if isinstance(value, tuple) else value)
        named = message.startswith(f"command line: {key} must be")  # where it was set, then the key
        if not (named and f"got {shown}" in message and "Fix: --" in message):
            failed.append(f"{cls.__name__} {key} {raw}: {message}")
    assert failed == []


def test_a_rule_of_a_group_names_the_group_where_it_is_used():
    with pytest.raises(
        ConfigError,
        match=r"^command line: critic_optim\.warmup_steps must be >= 0 \(optimizer steps\), got -1\. Fix: --critic_optim",
    ):
        load_config(RLConfig, overrides={"critic_optim": {"warmup_steps": -1}})
    with pytest.raises(ConfigError, match=r"^command line: model\.critic_lora\.r must be >= 1, got 0"):
        load_config(RLConfig, overrides={"model": {"critic_lora": {"enabled": True, "r": 0}}})


# -- one precision key, `dtype`, in every stage; the old spellings are unknown keys ---------------------


def test_dtype_is_one_key_in_every_stage_and_the_old_spellings_are_refused_with_the_fix():
    assert load_config(RLConfig, overrides=parse_overrides(["--dtype", "bfloat16"])).dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"unknown key 'model\.dtype'.*Fix: drop --model\.dtype"):
        load_config(RLConfig, overrides={"model": {"dtype": "float32"}})
    with pytest.raises(ConfigError, match=r"unknown key 'train\.overlap_critic'.*Fix:"):
        load_config(RLConfig, overrides={"train": {"overlap_critic": False}})
    for cls in (SFTConfig, RewardConfig, EvalConfig, RMEvalConfig):  # the same key everywhere
        assert "dtype" in {f.name for f in dataclasses.fields(cls)}, cls
