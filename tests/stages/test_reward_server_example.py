"""examples/reward_server/run.sh runs: a tiny policy and reward model, the reward model served by
`rlhf serve-rm`, a GRPO run scored over HTTP and the same run scored locally; the script prints that
their rewards match and stops the server (two optimizer steps of SFT and RM instead of the default:
the script's plumbing, not a trained model)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "reward_server" / "run.sh"


@pytest.mark.slow  # six processes of their own (imports dominate): 45-65 s on 2 busy cores
def test_the_reward_server_example_matches_the_local_run(tmp_path):
    pytest.importorskip("aiohttp")  # the `serve` extra
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if shutil.which("rlhf", path=path) is None:
        pytest.skip("the `rlhf` command is not installed (pip install -e .)")
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path), "STEPS": "2"}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    assert (
        "MATCH: the reward server's scores equal the local reward model's over 2 iterations" in result.stdout
    )
    (run,) = tmp_path.iterdir()  # one fresh folder per invocation
    assert (run / "server.log").read_text().splitlines()[-1] == "stopped"  # SIGTERM from the script
    for name in ("grpo_remote", "grpo_local"):
        rows = [json.loads(line) for line in (run / name / "metrics.jsonl").read_text().splitlines()]
        assert [row["iteration"] for row in rows if "reward/raw_mean" in row] == [0, 1], name
