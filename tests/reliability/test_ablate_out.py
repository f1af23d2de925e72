"""`rlhf ablate --out` and `rlhf demo --out` own their folder: a fresh --out that holds
anything an earlier run of the same command did not leave (a model, a project folder, the folder of
the --config file) or that is an existing file is refused before any work, touching nothing. (An
ablation's own folder taken over: tests/rundir/test_rundir_outputs.py.)"""

from __future__ import annotations

import shutil

import pytest

from tests.support.reliability_testing import InProcess, assert_user_error, file_bytes


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "config.yaml").write_text("iterations: 1\n")
    (folder / "notes.txt").write_text("mine\n")
    return folder


@pytest.mark.parametrize("command", ["ablate", "demo"])
def test_a_folder_of_the_users_is_refused_untouched(files, tmp_path, project, capsys, command):
    model = tmp_path / "model"
    shutil.copytree(files["rm"], model)
    (tmp_path / "afile.txt").write_text("mine\n")
    before = file_bytes(tmp_path)
    cases = [
        (["--out", project], ("--out", "not empty", "notes.txt", f"`rlhf {command}`", "Fix: --out a new")),
        (["--out", model], ("is a model directory", "Fix: --out a new")),
        (["--out", project, "--config", project / "config.yaml"], ("holds the --config file", "Fix:")),
        (["--out", tmp_path / "afile.txt"], ("is an existing file", "Fix: --out a new directory")),
    ]
    for args, says in cases:
        assert_user_error(InProcess(capsys, command, *args), *says)
    assert file_bytes(tmp_path) == before
