"""rlhf/rundir/checkpoint.py: checkpoints are verified on load: DONE records every file's size and
sha256; a damaged newest checkpoint is skipped with a warning naming it; stale temporary directories
are cleaned. (A run resuming past a damaged checkpoint, end to end:
tests/reliability/test_resume_damaged_checkpoint.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rlhf.rundir import checkpoint as ckpt


def make_checkpoint(run, iteration: int, *, old_style: bool = False):
    """A checkpoint directory written as rlhf/rl/trainer.py writes one (state + DONE in atomic_directory)."""
    target = run / "checkpoints" / f"iter_{iteration:06d}"
    with ckpt.atomic_directory(target) as tmp:
        ckpt.save_state({"iteration": iteration, "w": torch.arange(4.0) * iteration}, tmp, "trainer")
        if old_style:
            (tmp / "DONE").write_text(str(iteration))
        else:
            ckpt.write_done(tmp, iteration)
    return target


def test_done_records_sizes_and_checksums(tmp_path):
    path = make_checkpoint(tmp_path, 3)
    record = json.loads((path / "DONE").read_text())
    assert record["iteration"] == 3
    for name in ("trainer.json", "trainer.safetensors"):
        data = (path / name).read_bytes()
        import hashlib

        assert record["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ckpt.verify(path) is None


def test_an_old_style_done_written_by_the_trainer_gets_the_full_record(tmp_path):
    path = make_checkpoint(tmp_path, 2, old_style=True)
    assert set(json.loads((path / "DONE").read_text())["files"]) == {"trainer.json", "trainer.safetensors"}
    # and an old-style DONE already on disk (runs of earlier versions) still loads
    (path / "DONE").write_text("2")
    assert ckpt.verify(path) is None and ckpt.read_done(path) == {"iteration": 2, "files": None}


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            lambda p: (p / "trainer.safetensors").write_bytes((p / "trainer.safetensors").read_bytes()[:-7]),
            "bytes",
        ),
        (
            lambda p: (p / "trainer.json").write_text((p / "trainer.json").read_text().replace("3", "9")),
            "sha256",
        ),
        (lambda p: (p / "trainer.json").unlink(), "trainer.json is missing"),
        (lambda p: (p / "DONE").unlink(), "no DONE"),
        (lambda p: (p / "DONE").write_text("{"), "not readable"),
        (lambda p: (p / "DONE").write_text("7"), "DONE says iteration 7"),
    ],
)
def test_latest_verified_skips_damaged_newest_with_a_warning(tmp_path, damage, expected):
    older = make_checkpoint(tmp_path, 2)
    newest = make_checkpoint(tmp_path, 3)
    damage(newest)
    assert expected in ckpt.verify(newest)
    warnings: list[str] = []
    assert ckpt.latest_verified(tmp_path, warnings.append) == older
    assert len(warnings) == 1 and str(newest) in warnings[0] and expected in warnings[0]


def test_no_complete_checkpoint_gives_none(tmp_path):
    assert ckpt.latest_verified(tmp_path, print) is None
    (make_checkpoint(tmp_path, 1) / "DONE").unlink()
    assert ckpt.latest_verified(tmp_path, lambda m: None) is None


def test_clean_stale_removes_dead_writers_leftovers_only(tmp_path):
    root = tmp_path / "checkpoints"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)  # a process that has exited
    leftovers = [root / f".iter_000004.tmp-{dead_pid}", root / "iter_000005"]
    alive = root / f".iter_000006.tmp-{os.getpid()}"  # a live writer's directory stays
    for d in (*leftovers, alive):
        d.mkdir(parents=True)
    (leftovers[0] / "policy.safetensors").write_bytes(b"partial")
    # killed between the two renames of atomic_directory: the old copy is the only copy, restored
    complete = make_checkpoint(tmp_path, 7)
    complete.rename(root / f".iter_000007.old-{dead_pid}")
    removed = ckpt.clean_stale(tmp_path)
    assert sorted(removed) == sorted(leftovers)
    assert alive.is_dir() and ckpt.verify(root / "iter_000007") is None
    assert sorted(p.name for p in root.iterdir()) == sorted([alive.name, "iter_000007"])


def test_atomic_export_keeps_other_files_and_leaves_no_partial_file(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    (out / "config.json").write_text("old")
    with pytest.raises(OSError), ckpt.atomic_export(out) as tmp:
        (tmp / "config.json").write_text("new")
        raise OSError(28, "No space left on device")
    assert (out / "config.json").read_text() == "old"  # a failed export replaces nothing
    with ckpt.atomic_export(out) as tmp:
        (tmp / "config.json").write_text("new")
        (tmp / "critic").mkdir()
        (tmp / "critic" / "w").write_text("w")
    assert (out / "config.json").read_text() == "new" and (out / "critic" / "w").read_text() == "w"
    assert (out / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "critic", "metrics.jsonl"]
