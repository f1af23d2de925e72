"""`--out` is tried before any work (rundir/directory.check_writable_dir): a directory that cannot be
made or written is refused, exit 2, naming it; the folders the probe made are removed again."""

from __future__ import annotations

import os

import pytest

from rlhf.config import ConfigError
from rlhf.rundir.directory import check_writable_dir


def test_a_creatable_out_is_tried_and_left_as_it_was(tmp_path):
    check_writable_dir(tmp_path / "runs" / "a b" / "sft 1")  # spaces, three missing levels
    assert list(tmp_path.iterdir()) == []  # nothing made stays
    (tmp_path / "run").mkdir()
    check_writable_dir(tmp_path / "run")  # an existing folder: a file written and removed
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.parametrize(
    "out, says",
    [
        ("notes.txt/run", "is under notes.txt, which is not a folder"),
        ("r" * 300 + "/run", "cannot be written: File name too long"),
        ("/proc/rlhf-out", "cannot be written"),
    ],
)
def test_an_out_that_cannot_be_written_is_refused_naming_it(tmp_path, monkeypatch, out, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="Fix: --out") as refused:
        check_writable_dir(out)
    assert f"--out {out[:50]}" in str(refused.value) and says in str(refused.value)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine\n"
