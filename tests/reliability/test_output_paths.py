"""An --out a run must not write is refused before any work, exit 2, with nothing of the user's
changed: the model directory the run reads (sft/rm/dpo --model, train --policy/--reward-model), a
folder inside it, or an existing file."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.reliability_testing import assert_user_error, rlhf_in_process, train_args

# each refusal runs in this process (rlhf_in_process): it ends before any work (`rlhf sft` in a
# subprocess, as a user's shell starts it: tests/project/test_dependencies.py)


def digest(directory) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()
    }


@pytest.mark.parametrize("stage,data", [("sft", "sft"), ("rm", "pairs"), ("dpo", "pairs")])
@pytest.mark.parametrize("inside", [False, True])
def test_out_equal_to_or_inside_the_model_directory_is_refused(stage, data, inside, files, capsys):
    before = digest(files["policy"])
    out = files["policy"] / "run" if inside else files["policy"]
    result = rlhf_in_process(capsys, stage, "--model", files["policy"], "--data", files[data], "--out", out)
    assert_user_error(result, "--out", "--model directory", "Fix:")
    assert digest(files["policy"]) == before and not (files["policy"] / "run").exists()


@pytest.mark.parametrize("flag", ["policy", "rm"])
def test_train_out_equal_to_an_input_model_is_refused(flag, files, capsys):
    before = digest(files[flag])
    result = rlhf_in_process(capsys, *train_args(files, files[flag]))
    assert_user_error(result, "--out", "Fix:")
    assert digest(files[flag]) == before


def test_out_naming_an_existing_file_is_refused_and_the_file_kept(files, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = rlhf_in_process(
        capsys, "sft", "--model", files["policy"], "--data", files["sft"], "--out", target
    )
    assert_user_error(result, "is an existing file", "Fix:")
    assert target.read_text() == "mine"
