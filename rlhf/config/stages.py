"""The config class of each command that reads one (`rlhf config STAGE` lists its keys)."""

from __future__ import annotations

from typing import Any

from rlhf.config.dpo import DPOConfig
from rlhf.config.errors import ConfigError
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


RUN_STAGES = ("sft", "rm", "dpo", "train")  # the commands that write a run directory's config.yaml


def run_stage(config_yaml: Any) -> str | None:
    """The command that wrote the run's `config_yaml` (read from its keys: the stage whose keys hold
    every recorded one, with the fewest others), or None when no stage's keys do (not a run's)."""
    from rlhf.config.keys import leaf_keys
    from rlhf.config.loader import all_keys
    from rlhf.config.presets import read_yaml

    try:
        recorded = set(leaf_keys(read_yaml(config_yaml)))
    except ConfigError:
        return None
    best: tuple[int, str] | None = None
    for name in RUN_STAGES:
        keys = set(all_keys(STAGE_CONFIGS[name]))
        if recorded and recorded <= keys and (best is None or len(keys - recorded) < best[0]):
            best = (len(keys - recorded), name)
    return best[1] if best else None
