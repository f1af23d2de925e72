"""`rlhf eval --out` and `rlhf rm-eval --out` never overwrite a file that is not their own earlier
result: such a file (or a directory) is refused before any work, exit 2, the file byte-identical;
an earlier result of the same command is replaced."""

from __future__ import annotations

import json

import pytest

from tests.support.reliability_testing import InProcess, assert_ok, assert_user_error, rlhf


def eval_args(files, out):
    return ["eval", "--policy", files["policy"], "--baseline", files["policy"], "--judge", files["rm"],
            "--prompts", files["prompts"], "--n", "2", "--max-new-tokens", "2", "--out", out]  # fmt: skip


def rm_eval_args(files, out):
    return ["rm-eval", "--reward-model", files["rm"], "--data", files["pairs"], "--n", "4", "--out", out]


@pytest.mark.parametrize("args", [eval_args, rm_eval_args])
def test_out_naming_a_file_of_the_user_is_refused_and_kept(args, files, tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_bytes(b'{"mine": [1, 2, 3]}\n')
    assert_user_error(
        InProcess(capsys, *args(files, notes)), f"--out {notes}", "not an earlier result", "Fix:"
    )
    assert notes.read_bytes() == b'{"mine": [1, 2, 3]}\n'
    assert_user_error(InProcess(capsys, *args(files, tmp_path)), f"--out {tmp_path} is a directory", "Fix:")


@pytest.mark.slow
@pytest.mark.parametrize("args,key", [(eval_args, "comparison"), (rm_eval_args, "accuracy")])
def test_an_earlier_result_is_replaced_and_a_text_file_refused_in_a_subprocess(
    args, key, files, tmp_path, capsys
):
    out = tmp_path / "result.json"
    assert_ok(InProcess(capsys, *args(files, out)))
    assert_ok(InProcess(capsys, *args(files, out)))  # its own earlier output: replaced
    assert key in json.loads(out.read_text())
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    assert_user_error(rlhf(*args(files, text)), str(text), "Fix:")
    assert text.read_text() == "my notes\n"
