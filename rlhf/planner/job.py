"""`rlhf plan`'s job: a model, a preset's roles (or a supervised stage) and the command's settings
as the memory model's `Job` (memory_plan.py), planned."""

from __future__ import annotations

from typing import Any

from rlhf.config import ConfigError, RLConfig, load_config
from rlhf.planner.memory_plan import STAGES, Job, Plan, parse_bytes, plan, shape_of


def plan_for(
    model: str,
    preset: str,
    *,
    nodes: int,
    gpus: int,
    gpu_memory: str,
    rollout_batch: int | None,
    **settings: Any,
) -> Plan:
    """The plan of `model` under `preset` (an `rlhf train` preset, or sft | rm | dpo | simpo) on
    `nodes` x `gpus` ranks of `gpu_memory` each; `rollout_batch` None: the preset's; `settings`: the
    other fields of `Job` (lora, dtype, strategy, micro_batch, ...). A setting out of range is a
    ConfigError naming its flag."""
    stage = preset if preset in STAGES[1:] else "rl"  # sft | rm | dpo | simpo: a supervised stage
    roles = load_config(RLConfig, preset="ppo_max" if stage != "rl" else preset)
    critic = roles.model.critic_mode if roles.uses_critic and stage == "rl" else "none"
    try:
        job = Job(
            shape=shape_of(model),
            stage=stage,
            critic=critic,
            ranks=nodes * gpus,
            rollout_rows=rollout_batch or roles.rollout.batch_size,
            gpu_memory=parse_bytes(gpu_memory),
            **settings,
        )
        return plan(job)
    except ValueError as err:
        raise ConfigError(str(err)) from None
