"""Ctrl-C (SIGINT) or SIGTERM arriving while a checkpoint or an export is written waits until the
write is complete (rlhf/rundir/termination.py finish_first): the checkpoint that was due is kept,
whole, and the resume line names it, in `rlhf train`, `dpo` and `sft` run as a user runs them. (The
signal deferral itself, and a second Ctrl-C stopping at once: tests/rundir/test_rundir_termination.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from rlhf.rundir import checkpoint as ckpt
from tests.support.reliability_testing import InProcess, assert_ok, env, iterations, train_args

# a child process whose first write of a checkpoint (or of an export) sends the process SIGNAL half
# way through: after the state file, before DONE and the rename (before the tokenizer, for an export)
CHILD = """
import os, signal, sys
from rlhf.rundir import checkpoint
from rlhf.rundir import export

how, where, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
sig = getattr(signal, how)
fired = []

def fire():
    if not fired:
        fired.append(1)
        os.kill(os.getpid(), sig)

if where == "checkpoint":
    save_state = checkpoint.save_state
    def patched(state, directory, name):
        save_state(state, directory, name)
        fire()
    checkpoint.save_state = patched
else:
    export_copy = export.export_copy
    def patched(model):
        fire()
        return export_copy(model)
    export.export_copy = patched

from rlhf.cli import main
sys.exit(main(argv))
"""


def child(how: str, where: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, how, where, *map(str, args)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        # a test run started in the background (`make test &`) ignores SIGINT, and a child inherits
        # that: Python then installs no KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.slow
@pytest.mark.parametrize("how, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_a_train_checkpoint_keeps_it_and_the_run_resumes_from_it(
    files, tmp_path, capsys, how, code
):
    out = tmp_path / "run"
    run = child(
        how, "checkpoint", *train_args(files, out, "--train.iterations", "4", "--checkpoint.every", "2")
    )
    assert run.returncode == code, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["iter_000002"]
    assert ckpt.verify(out / "checkpoints" / "iter_000002") is None  # whole: DONE and every checksum
    assert not list((out / "checkpoints").glob(".iter_*"))  # no temporary left
    assert f"at iteration 2; resume with: rlhf train --resume {out}" in run.stderr, run.stderr[-2000:]
    assert "(from its checkpoint" not in run.stderr  # the checkpoint holds every iteration done
    assert_ok(InProcess(capsys, "train", "--resume", out))  # the resume itself needs no process of its own
    assert iterations(out) == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_sigterm_during_a_dpo_checkpoint_keeps_it_and_says_how_to_resume(files, tmp_path, capsys):
    out = tmp_path / "dpo"
    args = ["dpo", "--model", files["policy"], "--data", files["pairs"], "--out", out,
            "--train.max_steps", "4", "--train.batch_size", "4", "--checkpoint.every", "2", "--sinks", "jsonl"]  # fmt: skip
    run = child("SIGTERM", "checkpoint", *args)
    assert run.returncode == 143, run.stderr[-3000:]
    assert ckpt.verify(out / "checkpoints" / "iter_000002") is None
    assert (
        f"terminated (SIGTERM); the newest checkpoint holds the first 2 steps. Resume with: rlhf dpo --resume {out}"
        in run.stderr
    )
    assert_ok(InProcess(capsys, "dpo", "--resume", out))


@pytest.mark.slow
def test_a_ctrl_c_during_the_sft_export_lets_it_finish_and_says_so(files, tmp_path):
    out = tmp_path / "sft"
    args = ["sft", "--model", files["policy"], "--data", files["sft"], "--out", out,
            "--train.max_steps", "2", "--train.batch_size", "4", "--sinks", "jsonl"]  # fmt: skip
    run = child("SIGINT", "export", *args)
    assert run.returncode == 130, run.stderr[-3000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not [p.name for p in out.iterdir() if p.name.startswith(".export")]  # nothing half-moved
    assert (
        f"after the trained model was exported to {out}" in run.stderr and f"rlhf report {out}" in run.stderr
    )
