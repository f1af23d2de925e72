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
from rlhf.rundir.outputs import check_result_writable, keep_unwritable_result


def refuse_foreign_file(
    path: Path, keys: tuple[str, ...], command: str, default_name: str, default_note: str = ""
) -> None:
    """Raise ConfigError when `path` exists and is not an earlier result of `command` (a JSON object
    holding every one of `keys`), or is a directory, or its folder cannot be written (`default_note`:
    where the default result goes when no --out is given, for the message)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"--out {path} is a directory; {command} writes one JSON file. Fix: --out {path / default_name}."
        )
    if not path.exists():
        check_result_writable(path, default_note=default_note)
        return
    check_result_writable(path, default_note=default_note)
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
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except OSError as err:  # checked before the work, and still failing: the work is kept elsewhere
        raise keep_unwritable_result(path, result, err) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def refuse_replacing_other_result(
    path: Path, identity: dict[str, str], earlier_identity, command: str, suggestion: Path
) -> None:
    """Without --out: raise ConfigError when `path` holds an earlier result of `command` on other
    inputs (`identity`: the data file, and what else makes a result its own; `earlier_identity(json)`
    reads the same keys from the earlier result). Re-scoring the same inputs replaces it.

    Paths are compared resolved; an earlier value that cannot be read (None) is taken as the same."""
    path = Path(path)
    if not path.is_file():
        return
    try:
        earlier = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError):
        return  # refuse_foreign_file speaks for a file that is no result
    if not isinstance(earlier, dict):
        return
    before = earlier_identity(earlier)
    changed = [key for key, value in identity.items() if not _same(before.get(key), value)]
    if not changed:
        return
    was = ", ".join(f"{key} {before[key]}" for key in identity)
    now = ", ".join(f"{key} {identity[key]}" for key in changed)
    raise ConfigError(
        f"{path} holds an earlier result of {command} ({was}), and this run ({now}) would replace it. "
        f"Fix: --out {suggestion} (a result of its own), or move {path} away to replace it."
    )


def _same(earlier, now: str) -> bool:
    if earlier is None:
        return True
    return earlier == now or Path(str(earlier)).resolve() == Path(now).resolve()
