"""A model export is built whole beside the run's files and committed with one rename: a process
killed at any rename of the export (injected in a forked child) leaves the previous export, or no
loadable model until the next run, which finishes the committed export; never a mix of the two.
The run's own files are never touched, and an export's leftovers are cleaned."""

from __future__ import annotations

import os

import pytest

from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.lock import run_dir_lock

OLD = {"config.json": "old", "model.safetensors": "old", "tokenizer.json": "old", "critic/config.json": "old"}
NEW = {"config.json": "new", "model.safetensors": "new", "tokenizer.json": "new", "critic/config.json": "new"}
RUN_FILES = {"metrics.jsonl": "records", "config.yaml": "run config", "checkpoints/iter_000001/DONE": "1"}


def write(root, files: dict) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def visible(root) -> dict:
    """Every file under `root` but the hidden ones (leftovers, the lock)."""
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def export_killed_at(out, n: int) -> bool:
    """Export NEW into `out` in a forked child that dies (os._exit) at its n-th rename; True when it died."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no cleanup, as a killed process
        real_rename, real_replace, count = os.rename, os.replace, [0]

        def dying(real):
            def rename(src, dst, *args, **kwargs):
                count[0] += 1
                if count[0] == n:
                    os._exit(9)
                return real(src, dst, *args, **kwargs)

            return rename

        os.rename, os.replace = dying(real_rename), dying(real_replace)
        try:
            with ckpt.atomic_export(out) as tmp:
                write(tmp, NEW)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 9), status
    return os.WEXITSTATUS(status) == 9


def test_a_kill_at_any_rename_leaves_the_previous_export_or_finishes_the_new_one(tmp_path):
    outcomes = set()
    for n in range(1, 30):
        out = tmp_path / f"run{n}"
        write(out, {**OLD, **RUN_FILES})
        killed = export_killed_at(out, n)
        after_kill = visible(out)
        if "config.json" in after_kill:  # loadable: all of one export
            export = {k: v for k, v in after_kill.items() if k not in RUN_FILES}
            assert export in (OLD, NEW), (n, after_kill)
        with run_dir_lock(out):  # the next run into `out` cleans what the kill left
            pass
        now = visible(out)
        assert {k: now.pop(k) for k in RUN_FILES} == RUN_FILES  # the run's own files untouched
        assert now in (OLD, NEW), (n, now)
        assert [p.name for p in out.iterdir() if p.name.startswith(".export")] == []
        outcomes.add("new" if now == NEW else "old")
        if not killed:
            break
    assert n > 5 and outcomes == {"old", "new"}  # kills before and after the commit were both tried


def test_a_failed_export_keeps_the_previous_one_and_a_smaller_export_drops_stale_files(tmp_path):
    out = tmp_path / "run"
    write(
        out,
        {
            **OLD,
            **RUN_FILES,
            "model-00001-of-00002.safetensors": "shard",
            "model.safetensors.index.json": "{}",
        },
    )
    with pytest.raises(OSError), ckpt.atomic_export(out) as tmp:
        write(tmp, {"config.json": "half"})
        raise OSError("disk full")
    assert visible(out)["config.json"] == "old" and not list(out.glob(".export*"))
    with ckpt.atomic_export(out) as tmp:
        write(tmp, {"config.json": "new", "model.safetensors": "new"})
    now = visible(out)
    assert {k: now.pop(k) for k in RUN_FILES} == RUN_FILES
    assert now == {"config.json": "new", "model.safetensors": "new"}  # old shards, critic, tokenizer gone
