"""rlhf/rundir/lock.py: the run directory's lock dies with its holder, even one killed with SIGKILL.
(A second `rlhf train` into a running run's --out, end to end: tests/reliability/test_run_dir_lock.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from rlhf.rundir.lock import LOCK_FILE, RunDirInUse, run_dir_lock
from tests.support.reliability_testing import env


@pytest.mark.slow
def test_a_writer_killed_with_sigkill_leaves_no_lock_behind(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"from rlhf.rundir.lock import run_dir_lock\nimport time\nwith run_dir_lock({str(run)!r}):\n"
         "    print('locked', flush=True)\n    time.sleep(600)\n"],
        env=env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        try:
            with run_dir_lock(run):
                raise AssertionError("the lock of a live holder was taken")
        except RunDirInUse as busy:
            assert f"pid {holder.pid}" in str(busy)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert (run / LOCK_FILE).read_text().strip() == str(holder.pid)  # the file stays ...
    with run_dir_lock(run):  # ... but the lock died with its process
        pass
