"""`rlhf train --resume` past a damaged newest checkpoint: it is skipped with a warning naming the
file, set aside for inspection, and the run resumes from the one before; with every checkpoint
damaged, one message and exit 2. (The checks themselves: tests/rundir/test_rundir_checkpoint.py.)"""

from __future__ import annotations

import pytest

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    iterations,
    train_args,
)


@pytest.mark.slow
def test_resume_falls_back_from_a_truncated_newest_checkpoint(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert_ok(
        InProcess(capsys, *train_args(files, out, "--train.iterations", "3", "--checkpoint.every", "1"))
    )
    first = iterations(out)
    newest = out / "checkpoints" / "iter_000003"
    policy = newest / "policy.trained.safetensors"
    policy.write_bytes(policy.read_bytes()[:100])
    stale = out / "checkpoints" / ".iter_000009.tmp-999999999"
    stale.mkdir()
    result = InProcess(capsys, "train", "--resume", out, "--train.iterations", "4")
    assert_ok(result)
    assert (
        f"skipping damaged checkpoint {newest}" in result.stderr
        and "policy.trained.safetensors" in result.stderr
    )
    assert iterations(out) == [0, 1, 2, 3] and first == [0, 1, 2]
    assert (out / "checkpoints" / "damaged-iter_000003").is_dir()  # kept for inspection
    assert not stale.exists()

    for path in (out / "checkpoints").glob("iter_*"):
        (path / "trainer.json").write_text("{}")  # every checkpoint damaged: one message, exit 2
    refused = InProcess(capsys, "train", "--resume", out)
    assert_user_error(refused, "no complete checkpoint", "trainer.json", "--out")
