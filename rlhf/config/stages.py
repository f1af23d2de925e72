"""The config class of each command that reads one (`rlhf config STAGE` lists its keys)."""

from __future__ import annotations

from rlhf.config.dpo import DPOConfig
from rlhf.config.eval import EvalConfig
from rlhf.config.rl import RLConfig
from rlhf.config.rm import RewardConfig
from rlhf.config.rm_eval import RMEvalConfig
from rlhf.config.sft import SFTConfig

STAGE_CONFIGS: dict[str, type] = {
    "sft": SFTConfig,
    "rm": RewardConfig,
    "dpo": DPOConfig,
    "train": RLConfig,
    "eval": EvalConfig,
    "rm-eval": RMEvalConfig,
}


def stage_of(cls: type) -> str | None:
    """The command whose config `cls` is (None: not a stage's)."""
    return next((name for name, c in STAGE_CONFIGS.items() if c is cls), None)
