"""One writer per run directory, and Ctrl-C: a second `rlhf train` into a running run's --out is
refused before it writes anything; SIGINT ends the first with the command that continues it, and
that command works. (The lock dying with a SIGKILLed holder: tests/rundir/test_rundir_lock.py.)"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    iterations,
    records,
    start,
    train_args,
)


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.slow
def test_second_writer_is_refused_and_sigint_says_how_to_resume(files, tmp_path, capsys):
    out = tmp_path / "run"
    first = start(*train_args(files, out, "--train.iterations", "100000", "--checkpoint.every", "1"))
    try:
        wait_for(lambda: (out / "metrics.jsonl").is_file() and len(iterations(out)) >= 2)
        before = (out / "metrics.jsonl").read_text()
        config_before = (out / "config.yaml").read_bytes()

        # the second writer in this process: the lock is the first process's either way
        second = InProcess(capsys, *train_args(files, out, "--train.iterations", "2", "--kl.beta", "0.3"))
        assert_user_error(second, str(out), f"pid {first.pid}", "--out")
        assert first.poll() is None  # the first run was never disturbed
        assert (out / "config.yaml").read_bytes() == config_before  # the second wrote nothing
        assert (out / "metrics.jsonl").read_text().startswith(before)

        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    done = iterations(out)
    assert done == list(range(len(done)))  # every line whole, no record of the refused run
    expected = f"interrupted at iteration {done[-1] + 1}; resume with: rlhf train --resume {out}"
    assert expected in stderr, stderr[-2000:]

    # the suggested fix works: the run continues from its checkpoint to a new end
    target = done[-1] + 3
    resumed = InProcess(capsys, "train", "--resume", out, "--train.iterations", target)
    assert_ok(resumed)
    assert iterations(out) == list(range(target))
    assert all(isinstance(r, dict) for r in records(out))
