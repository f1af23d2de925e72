"""The JSON results of `rlhf eval` and `rlhf rm-eval`: never written over a file that is not one.

`--out` replaces the file it names. That is right for the command's own earlier result (running it
again updates it) and wrong for anything else (a user's notes, a data file, a model's config.json):
`refuse_foreign_file` stops before any work, and `write_result` writes the file whole or not at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlhf.config import ConfigError


def refuse_foreign_file(path: Path, keys: tuple[str, ...], command: str, default_name: str) -> None:
    """Raise ConfigError when `path` exists and is not an earlier result of `command` (a JSON object
    holding every one of `keys`), or is a directory."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"--out {path} is a directory; {command} writes one JSON file. Fix: --out {path / default_name}."
        )
    if not path.exists():
        return
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError):
        data = None
    if isinstance(data, dict) and all(key in data for key in keys):
        return  # an earlier result of the same command: replaced by the new one
    raise ConfigError(
        f"--out {path} exists and is not an earlier result of {command}: it would be overwritten. Fix: pass an "
        f"--out that does not exist yet (e.g. {path.with_name(default_name) if path.name != default_name else path.with_name('new_' + default_name)}), "
        "or move that file away."
    )


def write_result(path: Path, result: dict) -> None:
    """Write `result` as JSON to `path` whole or not at all (a temporary file renamed over it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
