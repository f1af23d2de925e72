"""The config of `rlhf train --resume DIR`: the recorded one, plus only the changes a resume can honour.

A checkpoint holds optimizer, scheduler, KL-controller, score and prompt-order state of the
recorded config. Changing the algorithm, the models or the data mid-run would either be silently
ignored (the checkpoint's state wins) or mix two runs in one record, so such changes are refused
with the keys listed. Changes that only extend the run or change what is written are applied
(and `config.yaml`, rewritten by the trainer, records them).
"""

from __future__ import annotations

from pathlib import Path

from rlhf.config import (
    ConfigError,
    RLConfig,
    config_from_yaml,
    deep_merge,
    from_dict,
    preset_dict,
    read_yaml,
    to_dict,
)
from rlhf.config.keys import refuse_inapplicable

# Keys a resumed run may change: how long it runs, how often it saves, what it logs where, and how
# its work is scheduled (the runtime group changes no result beyond float rounding).
RESUMABLE_KEYS = (
    "train.iterations",
    "runtime.overlap_critic",
    "runtime.split_forwards",
    "runtime.keep_freed_memory",
    "runtime.pack_weights",
    "checkpoint.every",
    "checkpoint.keep",
    "log.every",
    "log.sinks",
    "log.eval_every",
    "log.samples_to_log",
    "dist.runtime",  # local or Ray: the same numbers (tests/ray_runtime/test_ray_runtime.py)
    "ray.",  # every key of the group: where the roles run
    "reward.remote.",  # where the reward server runs and how it is asked (the same model is the user's word)
    "log.mismatch.",  # a monitor: measures, never changes a result
)


def changed_keys(recorded: dict, config, allowed: tuple[str, ...]) -> list[str]:
    """Every key whose value in `config` differs from the recorded run's and that a resume may not
    change, as "key (old -> new)"."""
    before, after = flatten_keys(recorded), flatten_keys(to_dict(config))
    return [
        f"{key} ({before.get(key)!r} -> {after[key]!r})"
        for key in after
        if after[key] != before.get(key) and not allowed_change(key, allowed)
    ]


def requested_config(
    config_class, recorded: dict, start: dict, file_data: dict | None, file: str, overrides: dict | None
):
    """`start` (the recorded config, or it and a preset) with the file's keys, then the command
    line's, merged on: a `config_class` config. Each change is first read on its own over the
    recorded config, so that a wrong key names its origin (the file, or the command line)."""
    requested = start
    for data, origin in ((file_data, file), (overrides, "command line")):
        if data:
            from_dict(config_class, deep_merge(recorded, data), origin=origin)
            requested = deep_merge(requested, data)
    config = from_dict(config_class, requested, origin="command line")
    refuse_inapplicable(config, [(file, file_data), ("command line", overrides)])  # the keys asked for now
    return config


def refuse_changes(command: str, kept: str, recorded: dict, config, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError listing every change of `config` from the `recorded` run outside `allowed`
    (`command`: the command that resumes, `kept`: what a resumed run keeps, both for the message)."""
    refused = changed_keys(recorded, config, allowed)
    if refused:
        may_change = ", ".join(k + "*" if k.endswith(".") else k for k in allowed)
        raise ConfigError(
            f"{command}: a resumed run keeps its {kept}, but these were changed: {', '.join(refused)}. "
            "Fix: drop those options to resume as recorded, or start a new run (another --out) with "
            f"them. A resume may change only: {may_change}."
        )


def allowed_change(key: str, allowed: tuple[str, ...]) -> bool:
    """`key` is one of `allowed`, or inside an allowed group ("ray." allows every ray key)."""
    return any(key == a or (a.endswith(".") and key.startswith(a)) for a in allowed)


def flatten_keys(data, prefix: str = "") -> dict:
    """A nested config dict as {"group.key": value} (a non-dict `data` under `prefix` itself)."""
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data} if prefix else {}
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resume_config(
    run_dir: str | Path, *, preset: str | None = None, file: str | None = None, overrides: dict | None = None
) -> RLConfig:
    """The recorded config of `run_dir` with the requested changes (preset < file < overrides).

    Raises ConfigError listing every requested change outside `RESUMABLE_KEYS` (a value equal to
    the recorded one is no change).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"rlhf train --resume: {run_dir}/config.yaml not found: {run_dir} is not an RL run directory. "
            "Fix: pass the --out directory of an earlier `rlhf train`."
        )
    refuse_other_stage(run_dir, "train")
    recorded = to_dict(config_from_yaml(RLConfig, run_dir / "config.yaml"))
    if not recorded.get("out") or Path(recorded["out"]).resolve() != run_dir.resolve():
        recorded["out"] = str(run_dir)  # the run directory given, wherever the run was first written
    start = deep_merge(recorded, {**preset_dict(preset), "preset": preset}) if preset else recorded
    config = requested_config(
        RLConfig, recorded, start, read_yaml(file) if file else None, str(file), overrides
    )
    refuse_changes(
        f"rlhf train --resume {run_dir}", "algorithm, models and data", recorded, config, RESUMABLE_KEYS
    )
    config.validate()  # the changes a resume may make are checked as a fresh run's are
    _refuse_going_back(run_dir, config.train.iterations, recorded["train"]["iterations"])
    return config


RESUMABLE_STAGES = ("train", "dpo")  # the commands with --resume


def refuse_other_stage(run_dir: Path, stage: str) -> None:
    """`rlhf STAGE --resume RUN_DIR` on a run another command wrote: the message names that command
    and the one that resumes it, rather than a key of its config.yaml this stage does not know."""
    from rlhf.config.stages import run_stage

    owner = run_stage(run_dir / "config.yaml")
    if owner is None or owner == stage:
        return
    how = (
        f"resume it with: rlhf {owner} --resume {run_dir}"
        if owner in RESUMABLE_STAGES
        else f"`rlhf {owner}` runs cannot be resumed; start a new `rlhf {stage}` run with another --out"
    )
    raise ConfigError(
        f"rlhf {stage} --resume: {run_dir} is a run of `rlhf {owner}`, not of `rlhf {stage}`. Fix: {how}."
    )


def _refuse_going_back(run_dir: Path, iterations: int, recorded: int) -> None:
    """A resume never rewrites the past: `--train.iterations` below what the run's newest checkpoint
    already holds is refused (equal to it: nothing to do, and config.yaml is left as it was)."""
    from rlhf.rundir.checkpoint import latest_verified

    latest = latest_verified(run_dir, warn=lambda message: None)
    done = 0 if latest is None else int(latest.name.split("_")[1])
    if iterations < done:
        raise ConfigError(
            f"rlhf train --resume {run_dir}: train.iterations {iterations} is fewer than the {done} iterations "
            f"the run already did (its newest checkpoint, {latest.name}); a resume cannot undo them. Fix: "
            f"--train.iterations {max(done + 1, recorded)} or more to continue the run, or use the run as it is.",
            "train.iterations",
        )
