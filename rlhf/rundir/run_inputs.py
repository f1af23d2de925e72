"""What a run read, recorded so that `rlhf train --resume` never continues on something else.

`RUN_DIR/run_inputs.json` holds the sha256 and size of every file of every model the run reads
(`model.policy`, `model.reward_model`: weights, configs, tokenizer files) and the sha256 and values of
the run's `config.yaml`. On resume, `check_models` stops naming a changed model file unless
`--resume-allow-changed-models` accepts it (recorded under `accepted_changes`);
`check_config_unedited` stops naming the keys of a hand-edited `config.yaml`. `write_config` rewrites
`config.yaml` only when its text changes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from rlhf.config import ConfigError, RLConfig, config_from_yaml, read_yaml, to_dict
from rlhf.models.files import model_files
from rlhf.rundir.checkpoint import sha256_file
from rlhf.rundir.resume import flatten_keys

RECORD = "run_inputs.json"
CONFIG = "config.yaml"
ALLOW_CHANGED_MODELS_FLAG = "--resume-allow-changed-models"
FORMAT = 1


def model_inputs(config) -> dict[str, dict]:
    """{config key: {"path", "files": {name: {"size", "sha256"}}}} of every model `config` reads (an
    RLConfig's policy and reward model; a supervised stage's `model`); a model that is no local
    directory (a hub id) is recorded with `"files": null` (not checked)."""
    if isinstance(config.model, str):  # sft, rm, dpo: the one model trained (dpo's reference too)
        models = {"model": (config.model, config.gguf_file)}
    else:
        models = {"model.policy": (config.model.policy, config.model.gguf_file)}
        if config.model.reward_model:
            models["model.reward_model"] = (config.model.reward_model, None)
    found = {}
    for key, (path, gguf_file) in models.items():
        if not path:
            continue
        local = Path(path).is_dir()
        files = {
            str(f.name): {"size": f.stat().st_size, "sha256": sha256_file(f)}
            for f in model_files(path, gguf_file)
        }
        found[key] = {"path": str(path), "files": files if local else None}
    return found


def read_record(run_dir: str | Path) -> dict | None:
    """The run's record, or None when it has none (a run from before records were kept)."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:
        raise ConfigError(
            f"{path} is not valid JSON: the record of the files this run read was damaged. Fix: restore it "
            f"from a backup, or delete it to resume without checking the models (a new record is written)."
        ) from None
    return record if isinstance(record, dict) else None


def _write_record(run_dir: Path, record: dict) -> None:
    path = Path(run_dir) / RECORD
    tmp = path.with_name(f".{RECORD}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, **record}, indent=1) + "\n")
    os.replace(tmp, path)


def record_models(run_dir: str | Path, models: dict[str, dict]) -> None:
    """Record `models` (`model_inputs`) as what the run in `run_dir` reads."""
    record = read_record(run_dir) or {}
    record["models"] = models
    _write_record(Path(run_dir), record)


def write_config(config: RLConfig, run_dir: str | Path) -> bool:
    """Write `config` to `run_dir/config.yaml` unless the file already says exactly that, and record
    its sha256 and values. Returns whether the file was written."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    values = to_dict(config)
    text = yaml.safe_dump(values, sort_keys=False)
    written = not path.is_file() or path.read_text() != text
    if written:
        tmp = path.with_name(f".{CONFIG}.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    record = read_record(run_dir) or {}
    if record.get("config", {}).get("sha256") != sha256_file(path) or written:
        record["config"] = {"sha256": sha256_file(path), "values": values}
        _write_record(run_dir, record)
    return written


def _current_values(path: Path) -> dict:
    """The values `path` holds now (defaults filled when it is a valid config; as written otherwise)."""
    try:
        return to_dict(config_from_yaml(RLConfig, path))
    except ConfigError:
        try:
            data = read_yaml(path)
        except ConfigError:
            return {}
        return data if isinstance(data, dict) else {}


def check_config_unedited(run_dir: str | Path) -> None:
    """Raise ConfigError listing the keys of `run_dir/config.yaml` whose values differ from those the
    run wrote (a hand edit); a change of layout or comments only is no change."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    record = read_record(run_dir)
    recorded = (record or {}).get("config")
    if not recorded or not path.is_file() or sha256_file(path) == recorded.get("sha256"):
        return
    before, after = flatten_keys(recorded.get("values") or {}), flatten_keys(_current_values(path))
    missing = "<missing>"
    changed = [
        f"{key} (the run wrote {before.get(key, missing)!r}, the file now says {after.get(key, missing)!r})"
        for key in sorted(set(before) | set(after))
        if key != "out" and before.get(key, missing) != after.get(key, missing)
    ]
    if not after:
        changed = ["it is no longer a readable config"]
    if not changed:
        return
    raise ConfigError(
        f"rlhf train --resume {run_dir}: {path} was edited after the run wrote it, so it no longer describes "
        f"the run: {'; '.join(changed)}. Fix: put the values the run wrote back into {path} (the run's record, "
        f"in {run_dir / RECORD}), then pass a change a resume may make as a flag (e.g. --train.iterations N); "
        "for any other change start a new run with another --out."
    )


def _file_changes(recorded: dict, now: dict) -> list[str]:
    changes = []
    for name in sorted(set(recorded) | set(now)):
        if name not in now:
            changes.append(f"{name} is missing")
        elif name not in recorded:
            changes.append(f"{name} is new")
        elif now[name]["sha256"] != recorded[name]["sha256"]:
            changes.append(
                f"{name} changed (sha256 {recorded[name]['sha256'][:12]}... at the start, {now[name]['sha256'][:12]}... now)"
            )
    return changes


def check_models(
    config,
    run_dir: str | Path,
    *,
    allow_changed: bool = False,
    iteration: int | None = None,
    warn: Callable[[str], None] = print,
    command: str = "rlhf train",
) -> None:
    """On resume: compare every model file `config` reads with the run's record. A change raises
    ConfigError naming the model key, the directory and the files, unless `allow_changed` (then it is
    said with `warn` and recorded). A run without a record gets one now (nothing to compare with)."""
    run_dir = Path(run_dir)
    record = read_record(run_dir) or {}
    now = model_inputs(config)
    recorded = record.get("models")
    if recorded is None:
        record_models(run_dir, now)
        return
    problems = []
    for key, info in now.items():
        before = recorded.get(key)
        if info["files"] is None:  # a hub id: nothing local to compare
            continue
        if before is None or before.get("files") is None:
            problems.append(f"{key} {info['path']} was not read when the run started")
            continue
        moved = "" if before["path"] == info["path"] else f" (the run started from {before['path']})"
        changes = _file_changes(before["files"], info["files"])
        if changes:
            problems.append(f"{key} {info['path']}{moved}: {', '.join(changes)}")
    if not problems:
        return
    if not allow_changed:
        raise ConfigError(
            f"{command} --resume {run_dir}: a model the run reads is not the one it started from: "
            f"{'; '.join(problems)}. Continuing would mix two runs in one record (another reference gives "
            f"another KL, another reward model other rewards). Fix: put back the model files the run started "
            f"from (their sha256 are in {run_dir / RECORD}), or pass {ALLOW_CHANGED_MODELS_FLAG} to continue "
            "on the changed models (recorded in the run)."
        )
    warn(
        f"warning: resuming on changed models ({ALLOW_CHANGED_MODELS_FLAG}): {'; '.join(problems)}. "
        f"The change is recorded in {run_dir / RECORD}."
    )
    record.setdefault("accepted_changes", []).append({"iteration": iteration, "changes": problems})
    record["models"] = now
    _write_record(run_dir, record)
