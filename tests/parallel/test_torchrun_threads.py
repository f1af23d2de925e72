"""Under a real torchrun: the OMP_NUM_THREADS=1 torchrun sets by itself is told apart from a user's,
and each rank takes its share of the cores (rlhf/parallel/threads.py, process_group.data_parallel)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two torchrun launches

ROOT = Path(__file__).resolve().parents[2]
RANK_SCRIPT = """
import json, torch
from rlhf.config import DistConfig
from rlhf.parallel.process_group import data_parallel, launch_rank
from rlhf.parallel.threads import available_cores, launcher_default_omp
with data_parallel(DistConfig(strategy="ddp", timeout=60), "cpu"):
    print(json.dumps({"rank": launch_rank(), "default": launcher_default_omp(),
                      "threads": torch.get_num_threads(), "cores": available_cores()}))
"""


def _ranks(tmp_path: Path, omp: str | None) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # each rank prints one flat JSON object; the two share stdout and may land on one line
    return sorted(
        (json.loads(found) for found in re.findall(r"\{[^{}]*\}", run.stdout)), key=lambda r: r["rank"]
    )


def test_torchruns_own_omp_default_is_ignored_and_a_users_is_kept(tmp_path):
    unset = _ranks(tmp_path, None)
    assert [r["default"] for r in unset] == [True, True]  # torchrun put the 1 there
    assert [r["threads"] for r in unset] == [max(1, r["cores"] // 2) for r in unset]  # the cores, shared
    users = _ranks(tmp_path, "1")
    assert [r["default"] for r in users] == [False, False]
    assert [r["threads"] for r in users] == [1, 1]
