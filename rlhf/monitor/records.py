"""Metric records as plain JSON: value conversion, reading and truncating `metrics.jsonl`.

A record is one flat JSON object per line. Training records carry their step under the key named by
their kind (`"iteration"` for RL, `"step"` for SFT / reward-model training); events carry
`"event"` (e.g. `{"event": "warning", "iteration": 12, "message": "..."}`). Values are JSON numbers,
strings, booleans, lists, or `null` for NaN / infinity (strict JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

STEP_KEYS = ("iteration", "step")  # the keys a record's step may be stored under


def to_json_value(value: Any, key: str = "?") -> Any:
    """Convert one metric value to a JSON-safe value.

    Tensors (anything with `.detach()`), numpy arrays and numpy scalars become Python floats/ints
    (a one-element tensor or array becomes a scalar, a larger one a list); NaN and +-inf become None;
    bools, ints and strings pass through. Raises TypeError naming `key` for anything else.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "detach") and callable(value.detach):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return to_json_value(value.item() if value.size == 1 else value.tolist(), key)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        as_float = float(value)
        return as_float if math.isfinite(as_float) else None
    if isinstance(value, (list, tuple)):
        return [to_json_value(item, key) for item in value]
    raise TypeError(
        f"metric {key!r}: cannot log a value of type {type(value).__name__}; "
        "log numbers, tensors, numpy values, strings, bools or lists of them"
    )


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into `"outer/inner"` keys and convert every value with `to_json_value`."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric keys must be strings, got {key!r} ({type(key).__name__})")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, prefix=f"{name}/"))
        else:
            flat[name] = to_json_value(value, name)
    return flat


def dumps_record(record: Mapping[str, Any]) -> str:
    """One strict-JSON line (no NaN tokens: values must already be converted)."""
    return json.dumps(record, allow_nan=False, separators=(", ", ": "))


def record_step(record: Mapping[str, Any]) -> int | None:
    """The step of a record (its `iteration` or `step` key), or None if it has none."""
    for key in STEP_KEYS:
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Read a `metrics.jsonl` file into a list of dicts, in file order.

    A run may have been killed in the middle of writing its last line: an unparsable final line
    without a trailing newline is skipped. Any other malformed line raises ValueError naming the
    file and line.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            interrupted_tail = number == len(lines) and not text.endswith("\n")
            if interrupted_tail:
                break
            raise ValueError(
                f"{path}:{number}: not a JSON object ({error.msg}); fix or delete this line"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def truncate_after(path: str | os.PathLike, step: int) -> int:
    """Drop every record whose step is > `step` (and an interrupted last line); return how many were kept.

    Records without an `iteration`/`step` key (e.g. critic pre-training records, keyed `pretrain`)
    are kept: a checkpoint is only written after pre-training has finished.

    The file is rewritten through a temporary file and `os.replace`, so a crash leaves either the
    old or the new file, never a half-written one.
    """
    path = Path(path)
    kept = [r for r in read_metrics(path) if record_step(r) is None or record_step(r) <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in kept:
            handle.write(dumps_record(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return len(kept)
