"""examples/tool_agent runs: its warm start writes a chat policy whose template reads `tools`, its
evaluation serves a policy and runs the calculator agent against it, and the agent's own command
runs against any OpenAI-compatible endpoint given by `--base-url` (a few steps and rows: the
scripts' plumbing, not the measured gain of examples/tool_agent/README.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.scripts import run_script

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tool_agent"


@pytest.mark.slow
def test_the_tool_agent_example_prepares_evaluates_and_runs_against_a_base_url(tmp_path, monkeypatch):
    run_script(monkeypatch, EXAMPLE / "prepare.py", "--out", tmp_path, "--steps", "2")
    rows = (tmp_path / "heldout.jsonl").read_text().splitlines()
    (tmp_path / "few.jsonl").write_text("\n".join(rows[:3]) + "\n")
    policy = str(tmp_path / "sft")
    assert "tools" in (tmp_path / "sft" / "chat_template.jinja").read_text()
    run_script(monkeypatch, EXAMPLE / "evaluate.py", policy, policy, "--prompts", tmp_path / "few.jsonl",
               "--samples", "1", "--out", tmp_path / "result.json")  # fmt: skip
    first, second = json.loads((tmp_path / "result.json").read_text())["results"]
    assert first["episodes"] == second["episodes"] == 3 and 0 <= first["accuracy"] <= 1
    assert len(first["accuracy_ci95"]) == 2 and 0 <= first["tool_call_share"] <= 1
    monkeypatch.syspath_prepend(str(EXAMPLE))  # evaluate.py imports calculator_agent.py beside it
    spec = importlib.util.spec_from_file_location("tool_agent_evaluate", EXAMPLE / "evaluate.py")
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    with evaluate.serving(policy, max_new_tokens=12, seed=0) as base_url:
        run_script(monkeypatch, EXAMPLE / "calculator_agent.py", "--base-url", base_url, "--model", "m",
                   "--prompts", tmp_path / "few.jsonl", "--out", tmp_path / "agent.json")  # fmt: skip
    assert json.loads((tmp_path / "agent.json").read_text())["episodes"] == 3
