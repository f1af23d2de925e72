"""What a command's `--out` names, classified once for every stage (`classify_out`): missing, a
dangling link, a file, an empty folder, a run of this stage, a run of another stage, a model folder,
or a folder of the user's files. The refusals (rlhf/rundir/directory.py, outputs.py) speak from it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlhf.config.stages import run_stage
from rlhf.monitor.logger import METRICS_FILE
from rlhf.rundir.lock import LOCK_FILE

RUN_RECORDS = {LOCK_FILE, METRICS_FILE, "run_inputs.json"}  # beside config.yaml: an rlhf run wrote it
KINDS = ("missing", "dangling_link", "file", "empty", "run", "other_run", "model", "user_files")


@dataclass(frozen=True)
class OutPath:
    kind: str  # one of KINDS
    entries: tuple[str, ...] = ()  # the folder's names (a folder)
    stage: str | None = None  # the command whose run it is (run, other_run)
    target: str = ""  # where a link points (dangling_link)


def classify_out(out: str | Path, stage: str) -> OutPath:
    """What `out` is for a run of `stage` (os.path: no OSError on a name too long)."""
    path = str(out)
    if not os.path.lexists(path):
        return OutPath("missing")
    if os.path.islink(path) and not os.path.exists(path):
        return OutPath("dangling_link", target=os.readlink(path))
    if not os.path.isdir(path):
        return OutPath("file")
    try:
        entries = tuple(sorted(os.listdir(path)))
    except OSError:
        return OutPath("user_files")  # check_writable_dir speaks for a folder that cannot be read
    if not entries:
        return OutPath("empty")
    if "config.yaml" in entries and RUN_RECORDS & set(entries):  # a run's (not a config file of yours)
        owner = run_stage(Path(path) / "config.yaml")
        if owner is not None:
            return OutPath("run" if owner == stage else "other_run", entries, owner)
    if "config.json" in entries:
        return OutPath("model", entries)
    return OutPath("user_files", entries)
