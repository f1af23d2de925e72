"""`rlhf eval` against a judge that gives NaN scores stops with a message naming the judge and the
rows (no eval.json with a bare NaN); another judge, the message's fix, works. Temperature 0 is
greedy decoding; --skip-invalid skips bad prompt lines and says how many."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.reliability_testing import InProcess, assert_ok, assert_user_error


def eval_args(files, judge, out, *extra):
    return ["eval", "--policy", files["policy"], "--baseline", files["policy"], "--judge", judge,
            "--prompts", files["prompts"], "--n", "4", "--max-new-tokens", "2", "--out", out, *extra]  # fmt: skip


@pytest.mark.slow
def test_nan_judge_is_named_with_its_rows_and_another_judge_works(files, tmp_path, capsys):
    broken = tmp_path / "nan-rm"
    judge = ScalarHeadModel.from_pretrained(files["rm"])
    with torch.no_grad():
        judge.head.weight.fill_(float("nan"))
    judge.save_pretrained(broken)
    out = tmp_path / "eval.json"
    stderr = assert_user_error(
        InProcess(capsys, *eval_args(files, broken, out)), f"judge {broken}", "prompts 1, 2, 3, 4", "--judge"
    )
    assert "non-finite" in stderr
    assert not out.exists()

    assert_ok(InProcess(capsys, *eval_args(files, files["rm"], out, "--temperature", "0")))
    result = json.loads(out.read_text())
    assert math.isfinite(result["policy"]["mean"])
    # greedy: the same policy against itself gives identical answers, so every pair ties
    assert result["comparison"]["tie"] == 1.0


def test_eval_skips_invalid_prompt_lines_when_asked(files, tmp_path, capsys, caplog):
    prompts = tmp_path / "prompts.jsonl"
    good = files["prompts"].read_text().splitlines()
    prompts.write_text("\n".join([good[0], "{not json", good[1], '{"prompt": ""}', good[2]]) + "\n")
    args = eval_args({**files, "prompts": prompts}, files["rm"], tmp_path / "eval.json")
    assert_user_error(InProcess(capsys, *args), f"{prompts}:2", "--skip-invalid")
    assert_ok(InProcess(capsys, *args, "--skip-invalid"))
    assert "2 invalid record(s) skipped" in caplog.text and f"{prompts}:4" in caplog.text
    assert json.loads((tmp_path / "eval.json").read_text())["comparison"]["n"] == 3
