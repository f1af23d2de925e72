"""examples/arithmetic/run.py end to end at a tiny size: the task written, the warm-up, the RL stage
against the verifier, the held-out accuracy measured before and after (its numbers are in
docs/verifiable_rewards.md; here only that every step runs and reports consistently)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location(
        "arithmetic_example", ROOT / "examples" / "arithmetic" / "run.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dapo", "ppo_max"])
def test_the_example_runs_and_reports(algorithm: str, tmp_path) -> None:
    example = load_example()
    out = tmp_path / "arith"
    args = ["--out", str(out), "--algorithm", algorithm, "--iterations", "2", "--sft-steps", "3"]
    result = example.main([*args, "--rollout.batch_size", "4"])  # an RL override passed through
    saved = json.loads((out / f"results-{algorithm}-seed0.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["overrides"] == {"rollout": {"batch_size": 4}}
    for key in ("before", "after"):
        stat = saved[key]
        assert stat["n"] == saved["held_out_problems"] == 166
        assert stat["accuracy"] == stat["correct"] / stat["n"]
        assert stat["ci95"][0] <= stat["accuracy"] <= stat["ci95"][1]
    rows = [
        json.loads(line)
        for line in (out / f"rl-{algorithm}-seed0" / "metrics.jsonl").read_text().splitlines()
    ]
    iterations = [r for r in rows if "iteration" in r and "event" not in r]
    assert len(iterations) == 2 and all("reward/part/rlhf.worlds.arithmetic:correct" in r for r in iterations)
    if algorithm == "dapo":
        assert all("dynamic_sampling/rounds" in r for r in iterations)
