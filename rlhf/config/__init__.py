"""Configuration: one dataclass per stage, YAML presets, dotted command-line overrides.

    fields.py, keys.py, checks.py   choices, each key's range/unit/condition, cross-key rules
    common.py, supervised.py        groups every stage shares; what sft, rm and dpo share
    rollout.py, rl_algorithm.py, rl.py   rlhf train: sampling, the PPO tricks, the stage config
    eval.py, rm_eval.py, ray.py     rlhf eval, rlhf rm-eval, `dist.runtime ray`
    presets.py, loader.py           the shipped presets; overrides, layering, load/save
    stages.py, listing.py           the config class of each command; `rlhf config STAGE`

Every field has a default and a one-line comment (the doc `rlhf config` shows)."""

from __future__ import annotations

from rlhf.config.agent import AgentConfig
from rlhf.config.common import DistConfig, LoraConfig, OptimConfig
from rlhf.config.dpo import DPOConfig, DPODataConfig, DPOLossConfig, DPOTrainConfig
from rlhf.config.env import EnvConfig
from rlhf.config.errors import ConfigError
from rlhf.config.eval import EvalConfig, EvalDataConfig, EvalRolloutConfig
from rlhf.config.fields import choices
from rlhf.config.loader import (
    all_keys,
    config_from_yaml,
    deep_merge,
    from_dict,
    load_config,
    parse_overrides,
    save_config,
    to_dict,
)
from rlhf.config.presets import PRESET_DIR, PRESETS, preset_dict, read_yaml
from rlhf.config.rl import (
    CRITIC_KEYS,
    CheckpointConfig,
    CollapseConfig,
    LogConfig,
    RLConfig,
    RLDataConfig,
    RLModelConfig,
    RLTrainConfig,
    RuntimeConfig,
)
from rlhf.config.rl_algorithm import (
    AdvantageConfig,
    CriticConfig,
    KLConfig,
    OnlineDPOConfig,
    PolicyLossConfig,
    RewardProcessingConfig,
)
from rlhf.config.rm import RewardConfig, RewardDataConfig, RewardTrainConfig
from rlhf.config.rm_eval import RMEvalConfig
from rlhf.config.rollout import MIN_USEFUL_TEMPERATURE, PAPER_SAMPLING, RolloutConfig, rollout_sampling
from rlhf.config.sft import SFTConfig, SFTDataConfig, SFTTrainConfig
from rlhf.config.supervised import SupervisedConfig, SupervisedDataConfig, SupervisedTrainConfig

__all__ = [
    "DPOConfig",
    "DPODataConfig",
    "DPOLossConfig",
    "DPOTrainConfig",
    "CRITIC_KEYS",
    "MIN_USEFUL_TEMPERATURE",
    "PAPER_SAMPLING",
    "PRESETS",
    "PRESET_DIR",
    "AdvantageConfig",
    "CheckpointConfig",
    "CollapseConfig",
    "ConfigError",
    "CriticConfig",
    "DistConfig",
    "EvalConfig",
    "EvalDataConfig",
    "AgentConfig",
    "EnvConfig",
    "EvalRolloutConfig",
    "KLConfig",
    "LogConfig",
    "LoraConfig",
    "OnlineDPOConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "RLConfig",
    "RLDataConfig",
    "RLModelConfig",
    "RLTrainConfig",
    "RMEvalConfig",
    "RewardConfig",
    "RewardDataConfig",
    "RewardProcessingConfig",
    "RewardTrainConfig",
    "RolloutConfig",
    "RuntimeConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainConfig",
    "SupervisedConfig",
    "SupervisedDataConfig",
    "SupervisedTrainConfig",
    "all_keys",
    "choices",
    "config_from_yaml",
    "deep_merge",
    "from_dict",
    "load_config",
    "parse_overrides",
    "preset_dict",
    "read_yaml",
    "rollout_sampling",
    "save_config",
    "to_dict",
]
