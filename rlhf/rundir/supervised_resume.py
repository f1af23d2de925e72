"""The config of a resumed supervised run (`rlhf dpo --resume DIR`): the recorded one, plus only the
changes a resume can honour.

As for `rlhf train --resume` (rlhf/rundir/resume.py): a checkpoint holds the optimizer, the schedule
over the recorded number of steps, the data order of the recorded seed and data, and the cached
reference log-probs of the recorded model, so a change of any of those is refused with the keys
listed; a change of what is written and how often is applied (and recorded in `config.yaml`).
"""

from __future__ import annotations

from pathlib import Path

from rlhf.config import ConfigError, config_from_yaml, read_yaml, to_dict
from rlhf.rundir.resume import refuse_changes, refuse_other_stage, requested_config

# Keys a resumed supervised run may change: what it logs where and how often it evaluates and saves.
SUPERVISED_RESUMABLE_KEYS = (
    "train.eval_every",
    "train.log_every",
    "checkpoint.every",
    "checkpoint.keep",
    "sinks",
)


def supervised_resume_config(
    config_class, run_dir: str | Path, *, stage: str, file: str | None = None, overrides: dict | None = None
):
    """The recorded `config_class` config of `run_dir` with the requested changes (file < overrides).

    Raises ConfigError when `run_dir` holds no such run, or listing every requested change outside
    `SUPERVISED_RESUMABLE_KEYS` (a value equal to the recorded one is no change)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"rlhf {stage} --resume: {run_dir}/config.yaml not found: {run_dir} is not a run directory of "
            f"`rlhf {stage}`. Fix: pass the --out directory of an earlier `rlhf {stage}`."
        )
    refuse_other_stage(run_dir, stage)
    recorded = to_dict(config_from_yaml(config_class, run_dir / "config.yaml"))
    recorded["out"] = str(run_dir)  # the run directory given, wherever the run was first written
    config = requested_config(
        config_class, recorded, recorded, read_yaml(file) if file else None, str(file), overrides
    )
    refuse_changes(
        f"rlhf {stage} --resume {run_dir}",
        "model, data, optimizer and schedule",
        recorded,
        config,
        SUPERVISED_RESUMABLE_KEYS,
    )
    config.validate()
    return config
