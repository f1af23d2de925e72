"""What a finished run directory keeps on disk, and why: the line `rlhf train`, `sft`, `rm`
and `dpo` print before the report's path."""

from __future__ import annotations

import os
from pathlib import Path

from rlhf.models.files import is_model_file
from rlhf.rundir.checkpoint import list_checkpoints


def tree_bytes(path: Path) -> int:
    """Bytes of the file `path`, or of every file under the directory `path` (links not followed)."""
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum((Path(root) / f).lstat().st_size for f in files)
    return total


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _is_export(path: Path) -> bool:
    """The exported model's files (weights, configs, tokenizer) and sub-models' folders (`critic/`)."""
    if path.name.startswith("."):
        return False
    return (path / "config.json").is_file() if path.is_dir() else is_model_file(path.name)


def footprint_line(run_dir: str | Path, keep: int) -> str:
    """`RUN_DIR keeps 1.2 GB: checkpoints/ 0.8 GB (...), the exported model 0.4 GB (...), records ...`:
    each part's size and what it is for (the checkpoints' only when there are some); `keep` is the
    run's `checkpoint.keep`."""
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"
    ckpt_bytes = tree_bytes(checkpoints) if checkpoints.is_dir() else 0
    export_bytes = sum(tree_bytes(p) for p in run_dir.iterdir() if _is_export(p))
    total = tree_bytes(run_dir)
    records = max(0, total - ckpt_bytes - export_bytes)
    count = len(list_checkpoints(run_dir))
    kept = (
        f"checkpoints/ {human_bytes(ckpt_bytes)} ({count} kept, checkpoint.keep {keep}: to resume or extend "
        "the run with --resume; delete them once done), "
        if count or ckpt_bytes
        else ""  # a run without checkpoints (sft, rm, dpo without checkpoint.every)
    )
    return (
        f"{run_dir} keeps {human_bytes(total)}: {kept}the exported model {human_bytes(export_bytes)} (what "
        f"from_pretrained loads), records {human_bytes(records)} (metrics, samples, report)"
    )
