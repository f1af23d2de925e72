"""The config a run opens with (`open_run`): a fresh run's `--config` < named flags < dotted overrides
(`rlhf train`: its preset under them) with the inputs the stage needs, or a resumed run's recorded
config with only the changes a resume can honour (resume.py, supervised_resume.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.config import ConfigError, load_config

SUPERVISED_STAGES = ("sft", "rm", "dpo")
RESUMABLE_SUPERVISED = ("dpo",)  # supervised stages with --resume (checkpoint.every)


@dataclass(frozen=True)
class RunRequest:
    """A run of `rlhf sft`, `rm`, `dpo` or `train` as the command line asks for it."""

    stage: str  # sft | rm | dpo | train
    config_class: type
    file: str | None = None  # --config FILE.yaml
    overrides: dict = field(default_factory=dict)  # dotted overrides, the named flags' values under them
    resume: str | None = None  # --resume RUN_DIR
    allow_changed_models: bool = False  # --resume-allow-changed-models
    preset: str | None = None  # rlhf train --preset
    reward_functions: tuple[str, ...] = ()  # rlhf train --reward-fn: a fresh run adds them (weight 1 each)
    # after the preflight checks: fit the config to this machine, returning the line that says how
    # (None: nothing changed); `rlhf train` sizes Ray's CPU reservations (rlhf/ray_runtime/machine_fit.py)
    fit_to_machine: Callable[[Any, set[str]], str | None] | None = None


def run_config(request: RunRequest):
    """The validated config of the run `request` asks for, fresh or resumed."""
    if request.resume:
        return resumed_config(request)
    if request.allow_changed_models:
        raise ConfigError(
            "--resume-allow-changed-models applies to `--resume RUN_DIR` only; a new run records "
            "the models it starts from. Fix: drop --resume-allow-changed-models, or add --resume RUN_DIR."
        )
    config = load_config(
        request.config_class, preset=request.preset, file=request.file, overrides=request.overrides
    )
    if request.stage == "train":
        config.reward.functions = [*config.reward.functions, *request.reward_functions]
    check_fresh_inputs(request.stage, config)
    return config


def resumed_config(request: RunRequest):
    """The recorded config of `--resume RUN_DIR` with the changes a resume may make (else refused)."""
    if request.stage == "train":
        from rlhf.rundir.resume import resume_config
        from rlhf.rundir.run_inputs import check_config_unedited

        check_config_unedited(request.resume)  # a hand-edited config.yaml would lie about the run
        return resume_config(
            request.resume, preset=request.preset, file=request.file, overrides=request.overrides
        )
    from rlhf.rundir.supervised_resume import supervised_resume_config

    return supervised_resume_config(
        request.config_class,
        request.resume,
        stage=request.stage,
        file=request.file,
        overrides=request.overrides,
    )


def check_fresh_inputs(stage: str, config) -> None:
    """A fresh run names what it reads (else the flag to pass), and trains no reward model's trunk as
    a causal LM (it has no trained LM head)."""
    if stage == "train":
        require(config.model.policy, "--policy")
        require(
            config.model.reward_model
            or config.reward.remote.url
            or config.reward.llm_judge.url
            or config.reward.functions
            or config.env.name
            or config.agent.name,
            "--reward-model (or --reward-url, --judge-url, --reward-fn, --env or --agent)",
        )
        require(config.data.prompts, "--prompts")
        refuse_reward_model_as_policy(config.model.policy)
        return
    require(config.model, "--model")
    require(config.data.path, "--data")
    if stage in ("sft", "dpo"):
        refuse_reward_model_as_policy(config.model, "--model", stage)


def model_flags(stage: str, config) -> dict[str, str | None]:
    """The model directories a run reads, by flag: its --out may be none of them (check_out_dir)."""
    if stage == "train":
        return {"--policy": config.model.policy, "--reward-model": config.model.reward_model}
    return {"--model": config.model}


def require(value, flag: str) -> None:
    if not value:
        raise ConfigError(f"missing {flag}. Fix: pass {flag} (or set it in --config).")


def refuse_reward_model_as_policy(policy: str, flag: str = "--policy", stage: str = "train") -> None:
    from rlhf.models.scalar_head import HEAD_WEIGHTS_NAME

    if (Path(policy) / HEAD_WEIGHTS_NAME).is_file():
        also = ", and this one as --reward-model" if stage == "train" else ""
        raise ConfigError(
            f"{flag} {policy} is a reward-model directory (it holds {HEAD_WEIGHTS_NAME}); `rlhf {stage}` "
            f"trains a causal LM (its language-model head). Fix: pass "
            f"{'a base causal LM (a save_pretrained directory or hub id)' if stage == 'sft' else 'the --out directory of `rlhf sft`'} "
            f"as {flag}{also}."
        )
