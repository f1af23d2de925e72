"""`rlhf ablate --out` and `rlhf demo --out` own their folder (issue 40): a fresh --out that holds
anything an earlier run of the same command did not leave (a model, a project folder, the folder of
the --config file) or that is an existing file is refused before any work, touching nothing."""

from __future__ import annotations

import shutil

import pytest

from rlhf.config import ConfigError
from rlhf.rundir.outputs import ABLATE_OUTPUTS, check_out_holds_nothing_of_yours
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


def test_an_ablation_folder_resumes(tmp_path):
    run = tmp_path / "ablate"
    for name in ("world", "sft", "rm", "runs"):
        (run / name).mkdir(parents=True)
    for name in (".lock", "stage.json", "ablation.json", "report.html", "ablation.md"):
        (run / name).write_text("{}")
    check_out_holds_nothing_of_yours(run, "ablate", leftovers=ABLATE_OUTPUTS)  # no refusal
    (run / "mine.txt").write_text("mine")
    with pytest.raises(ConfigError, match="mine.txt"):
        check_out_holds_nothing_of_yours(run, "ablate", leftovers=ABLATE_OUTPUTS)
