"""What a training run directory holds, read for its report: the kind of run, its records, warnings,
configuration and samples.

    run = read_run_dir("runs/ppo")     # NotARunDirectory (a ValueError with the fix) otherwise
    run.kind                           # "sft" | "rm" | "dpo" | "rl"

The kind comes from `metrics.jsonl`: RL records count `iteration` (and `pretrain` for critic
pre-training); SFT and reward-model records count `step`, and reward-model records carry accuracy or
ranking-loss keys. A directory whose metrics file holds no training record falls back to the
shape of its `config.yaml`, and is still refused: there is nothing to plot.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlhf.monitor.logger import SAMPLES_FILE
from rlhf.monitor.records import read_metrics

KINDS = {"sft": "SFT", "rm": "reward model", "dpo": "DPO", "rl": "RL"}
RM_KEYS = ("train/accuracy", "train/rank_loss", "eval/accuracy", "eval/rank_loss")
DPO_KEYS = ("train/chosen_reward", "eval/chosen_reward")  # implicit rewards: DPO's alone
EVAL_FILE = "eval.json"  # written beside a policy by `rlhf eval`
COMMANDS = "`rlhf sft`, `rlhf rm`, `rlhf train` or `rlhf demo`"


class NotARunDirectory(ValueError):
    """The directory holds no run that a report can be made of (the message names it and the fix)."""


@dataclass
class RunFiles:
    directory: Path
    kind: str  # "sft" | "rm" | "dpo" | "rl"
    step_key: str  # "step" or "iteration": the key counting the training records
    records: list[dict]  # training records, in file order
    pretrain: list[dict] = field(default_factory=list)  # RL critic pre-training records
    warnings: list[dict] = field(default_factory=list)  # {"step": int | None, "message": str}
    config: dict = field(default_factory=dict)  # config.yaml ({} if absent)
    samples: list[dict] = field(default_factory=list)  # samples.jsonl rows
    evaluation: dict | None = None  # eval.json


def read_run_dir(directory: str | os.PathLike) -> RunFiles:
    """Read a run directory; NotARunDirectory names what is missing and the fix."""
    d = Path(directory)
    if not d.is_dir():
        what = "is a file, not a directory" if d.exists() else "does not exist"
        raise NotARunDirectory(f"{d} {what}. Fix: pass the --out directory of {COMMANDS}.")
    config = recorded_config(d)
    records = _read_records(d)
    steps = [r for r in records if "event" not in r and ("iteration" in r or "step" in r)]
    pretrain = [r for r in records if "event" not in r and "pretrain" in r]
    kind = _kind_of_records(steps, pretrain) or _kind_of_config(config)
    if kind is None:
        raise NotARunDirectory(
            f"{d} is not a run directory of rlhf: no training records in metrics.jsonl and no config.yaml "
            f"of an sft, rm or train run (nor summary.json and runs.json of a demo). Fix: pass the --out "
            f"directory of {COMMANDS}."
        )
    if not steps:
        raise NotARunDirectory(
            f"{d} is the directory of a {KINDS[kind]} run that has logged no training step yet "
            f"(metrics.jsonl {'is empty' if (d / 'metrics.jsonl').is_file() else 'is missing'}): nothing to "
            f"report. Fix: run `rlhf report {d}` once the run has logged a step."
        )
    step_key = "iteration" if kind == "rl" else "step"
    warnings = [
        {"step": r.get(step_key, r.get("step", r.get("iteration"))), "message": str(r.get("message", ""))}
        for r in records
        if r.get("event") == "warning"
    ]
    return RunFiles(
        directory=d,
        kind=kind,
        step_key=step_key,
        records=[r for r in steps if step_key in r],
        pretrain=pretrain,
        warnings=warnings,
        config=config,
        samples=_read_samples(d / SAMPLES_FILE),
        evaluation=_read_json(d / EVAL_FILE),
    )


def _kind_of_records(steps: list[dict], pretrain: list[dict]) -> str | None:
    if pretrain or any("iteration" in r for r in steps):
        return "rl"
    if any(key in r for r in steps for key in DPO_KEYS):
        return "dpo"
    if any(key in r for r in steps for key in RM_KEYS):
        return "rm"
    if any("train/loss" in r for r in steps):
        return "sft"
    return None


def _kind_of_config(config: dict) -> str | None:
    model, train, data = config.get("model"), config.get("train"), config.get("data")
    if (isinstance(model, dict) and "policy" in model) or "rollout" in config:
        return "rl"
    if isinstance(config.get("dpo"), dict):
        return "dpo"
    if isinstance(train, dict) and "lm_coef" in train:
        return "rm"
    if isinstance(model, str) and isinstance(data, dict) and "max_response_tokens" in data:
        return "sft"
    return None


def _read_records(d: Path) -> list[dict]:
    path = d / "metrics.jsonl"
    if not path.is_file():
        return []
    try:
        return read_metrics(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise NotARunDirectory(f"{err}. Fix: repair or delete that line of {path}.") from None


def recorded_config(directory: str | os.PathLike) -> dict:
    """The `config.yaml` a run wrote into `directory`, as a dict: {} when there is none or it is
    not readable (a model directory from elsewhere, a damaged file): callers fall back to defaults."""
    path = Path(directory) / "config.yaml"
    if not path.is_file():
        return {}
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return {}
    return config if isinstance(config, dict) else {}


def recorded_data_settings(directory: str | os.PathLike) -> dict:
    """The `data` section of the run's `config.yaml` ({} when absent): the token budgets a model was
    trained with, which `rlhf eval` and `rlhf rm-eval` encode with."""
    data = recorded_config(directory).get("data", {})
    return data if isinstance(data, dict) else {}


def _read_samples(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by an interrupted run
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
