"""rlhf/rundir/termination.py: Ctrl-C (SIGINT) or SIGTERM arriving while a checkpoint or an export is
written (finish_first) is delivered once the write is complete; a second Ctrl-C stops at once, the
write being atomic; a failed write drops the signal. (Signals during `rlhf train`, `dpo` and `sft`,
end to end: tests/reliability/test_sigterm.py and test_signal_during_write.py.)"""

from __future__ import annotations

import os
import signal

import pytest

from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.termination import Terminated, finish_first, handle_sigterm


@pytest.fixture(autouse=True)
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt here too when the test run ignores SIGINT (started with `&`)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_sigterm_during_a_checkpoint_write_is_raised_once_it_is_complete():
    written = []
    with pytest.raises(Terminated), handle_sigterm():
        with finish_first():
            os.kill(os.getpid(), signal.SIGTERM)
            written.append("checkpoint")  # still runs: the signal waits
        written.append("next step")  # never runs
    assert written == ["checkpoint"]
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_a_signal_during_a_write_is_delivered_once_the_write_is_complete():
    for signum, error in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)):
        written = []
        with pytest.raises(error), handle_sigterm():
            with finish_first():
                os.kill(os.getpid(), signum)
                with finish_first():  # nested writes: delivered after the outer one
                    written.append("state")
                written.append("DONE")
            written.append("next step")  # never runs
        assert written == ["state", "DONE"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back


def test_a_second_ctrl_c_during_a_write_stops_at_once_and_a_failed_write_drops_the_signal(tmp_path):
    target = tmp_path / "checkpoints" / "iter_000002"
    with pytest.raises(KeyboardInterrupt):
        with ckpt.atomic_directory(target) as tmp:
            (tmp / "state.json").write_text("{}")
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the user will not wait
            (tmp / "more.json").write_text("{}")  # never written
    assert not target.exists() and list(target.parent.iterdir()) == []  # nothing half-written
    with pytest.raises(OSError, match="disk"):
        with finish_first():
            os.kill(os.getpid(), signal.SIGINT)
            raise OSError("disk full")  # the failure is what the user must see
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # `nohup`, `cmd &`: SIGINT ignored
    try:
        with finish_first():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # still ignored, nothing raised
    finally:
        signal.signal(signal.SIGINT, previous)
