"""Configuration: one dataclass per stage, YAML presets, dotted command-line overrides.

    errors.py        ConfigError
    fields.py        choices read from a field's type (Literal, registries), `coerce`
    keys.py          each key's range, unit and condition, declared beside its field (`setting`)
    checks.py        the helpers of the rules that tie several keys (each group's `validate(prefix)`)
    common.py        optimizer, LoRA and data-parallel groups every stage shares
    supervised.py    what sft, rm and dpo share (data, train, stage), specialized in sft.py, rm.py, dpo.py
    rollout.py       rlhf train's sampling (and the PPO paper's, `rollout.sampling: paper`)
    rl_algorithm.py  score processing, KL, advantages, policy loss, critic: the PPO tricks
    rl.py            rlhf train's models, data, run plumbing and the stage config
    eval.py          rlhf eval;  rm_eval.py: rlhf rm-eval;  ray.py: `dist.runtime ray`
    presets.py       the shipped presets (rlhf/presets/*.yaml) and the YAML reader
    loader.py        overrides, layering, from_dict/to_dict, load_config, save_config
    stages.py        the config class of each command;  listing.py: `rlhf config STAGE`

Every field has a default and a one-line comment (the doc `rlhf config` shows); a numeric one declares
its range, and a key that applies only under a condition declares it (`setting(...)`, keys.py).
"""

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
