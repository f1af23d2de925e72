"""examples/calculator_env runs: its warm start writes a loadable policy and prompt files, and its
held-out evaluation scores calculator episodes of that policy (a few steps and rows: the script's
plumbing, not the measured gain of examples/calculator_env/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.scripts import run_script

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "calculator_env"


@pytest.mark.slow
def test_the_calculator_example_prepares_and_evaluates(tmp_path, monkeypatch):
    run_script(monkeypatch, EXAMPLE / "prepare.py", "--out", tmp_path, "--steps", "2")
    rows = (tmp_path / "heldout.jsonl").read_text().splitlines()
    assert len(rows) == 100 and {"prompt", "answer"} <= set(json.loads(rows[0]))
    trained = {json.loads(line)["prompt"] for line in (tmp_path / "train.jsonl").read_text().splitlines()}
    assert not trained & {json.loads(row)["prompt"] for row in rows}  # no held-out question is trained on
    (tmp_path / "few.jsonl").write_text("\n".join(rows[:3]) + "\n")
    policy = str(tmp_path / "sft")
    run_script(monkeypatch, EXAMPLE / "evaluate.py", policy, policy, "--prompts", tmp_path / "few.jsonl",
               "--samples", "1", "--out", tmp_path / "result.json")  # fmt: skip
    result = json.loads((tmp_path / "result.json").read_text())
    first, second = result["results"]
    assert first["episodes"] == 3 and 0 <= first["accuracy"] <= 1 and len(first["accuracy_ci95"]) == 2
    assert first == second and result["gain"] == 0.0  # one policy, one seed: the same episodes
