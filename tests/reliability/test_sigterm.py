"""SIGTERM (what SLURM and Kubernetes send before preemption) ends `rlhf train` as Ctrl-C does: the
step under way is abandoned, exit code 143, the command that resumes it printed, no traceback, and
that command finishes the run. (A SIGTERM during a checkpoint write waits for it to be complete:
tests/rundir/test_rundir_termination.py.)"""

from __future__ import annotations

import signal

import pytest

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    iterations,
    records,
    start,
    train_args,
    wait_for,
)


@pytest.mark.slow
def test_sigterm_ends_train_with_143_and_the_resume_line_and_the_run_resumes(files, tmp_path, capsys):
    out = tmp_path / "run"
    run = start(*train_args(files, out, "--train.iterations", "100000", "--checkpoint.every", "1"))
    try:
        wait_for(lambda: (out / "metrics.jsonl").is_file() and len(iterations(out)) >= 2)
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    done = iterations(out)
    assert done == list(range(len(done)))  # every record whole
    expected = f"terminated (SIGTERM) at iteration {done[-1] + 1}; resume with: rlhf train --resume {out}"
    assert expected in stderr, stderr[-2000:]

    target = done[-1] + 3
    assert_ok(
        InProcess(capsys, "train", "--resume", out, "--train.iterations", target)
    )  # the printed command
    assert iterations(out) == list(range(target))
    assert all(isinstance(r, dict) for r in records(out))
