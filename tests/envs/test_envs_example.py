"""examples/calculator_env runs: its warm start writes a loadable policy and prompt files, and its
held-out evaluation scores calculator episodes of that policy (a few steps and rows: the script's
plumbing, not the measured gain of examples/calculator_env/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "calculator_env"


@pytest.mark.slow
def test_the_calculator_example_prepares_and_evaluates(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, str(EXAMPLE / "prepare.py"), "--out", str(tmp_path), "--steps", "2"]
    subprocess.run(run, check=True, env=env, capture_output=True)
    rows = (tmp_path / "heldout.jsonl").read_text().splitlines()
    assert len(rows) == 100 and {"prompt", "answer"} <= set(json.loads(rows[0]))
    trained = {json.loads(line)["prompt"] for line in (tmp_path / "train.jsonl").read_text().splitlines()}
    assert not trained & {json.loads(row)["prompt"] for row in rows}  # no held-out question is trained on
    (tmp_path / "few.jsonl").write_text("\n".join(rows[:3]) + "\n")
    policy = str(tmp_path / "sft")
    run = [sys.executable, str(EXAMPLE / "evaluate.py"), policy, policy, "--prompts", str(tmp_path / "few.jsonl"),
           "--samples", "1", "--out", str(tmp_path / "result.json")]  # fmt: skip
    subprocess.run(run, check=True, env=env, capture_output=True)
    result = json.loads((tmp_path / "result.json").read_text())
    first, second = result["results"]
    assert first["episodes"] == 3 and 0 <= first["accuracy"] <= 1 and len(first["accuracy_ci95"]) == 2
    assert first == second and result["gain"] == 0.0  # one policy, one seed: the same episodes
