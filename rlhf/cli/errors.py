"""How `rlhf` ends when something goes wrong: one message and an exit code, never a bare traceback.

- a mistake the user can fix (config, data, model directory, a busy run directory): the message
  (what, where, the fix) and exit code 2;
- a full disk: what could not be written and how to go on, exit code 2;
- Ctrl-C: where the run stopped and the command that continues it, exit code 130; SIGTERM (a
  scheduler's preemption) the same, exit code 143 (rlhf/rundir/termination.py);
- anything else is a bug: a one-line summary plus the path of a log file holding the traceback,
  exit code 1.
`run_with_one_error_path` runs a command and turns each of these into its message.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from rlhf.monitor.logger import METRICS_FILE
from rlhf.rundir.open_run import RunContext

USER_ERROR = 2
INTERNAL_ERROR = 1
INTERRUPTED = 130
TERMINATED = 143  # SIGTERM: 128 + 15, as a shell reports it
ERROR_LOG = "error.log"


def is_user_error(err: BaseException) -> bool:
    """Errors written for the user: the library's own types, and any ValueError that carries a fix."""
    from rlhf.config import ConfigError
    from rlhf.data.errors import DataError
    from rlhf.models.loading import ModelLoadingError
    from rlhf.monitor.sinks import MissingDependencyError
    from rlhf.worlds import WorldConfigError

    # a missing optional package and an unreadable world are the user's to fix (rlhf/preflight.py
    # checks both before any work; these catch a path it does not see)
    if isinstance(err, (ConfigError, DataError, ModelLoadingError, MissingDependencyError, WorldConfigError)):
        return True
    return isinstance(err, ValueError) and "Fix:" in str(err)


def no_space_message(ctx: RunContext, err: Exception) -> str:
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    then = (
        f"then continue with: rlhf train --resume {ctx.run_dir}"
        if ctx.resumable and ctx.run_dir and _last_checkpoint(ctx.run_dir) is not None
        else "then run the command again"
    )
    return f"no space left on the device{where}. Fix: free disk space (or pass an --out on another disk), {then}."


def is_no_space(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(err)  # writers that wrap the OSError (safetensors)


def _last_logged(run_dir: Path, key: str) -> int | None:
    """The largest `key` (iteration or step) recorded in the run's metrics file."""
    path = run_dir / METRICS_FILE
    last = None
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by the interrupt
        if isinstance(record, dict) and isinstance(record.get(key), int):
            last = max(last or 0, record[key])
    return last


def _last_checkpoint(run_dir: Path) -> int | None:
    from rlhf.rundir.checkpoint import latest_verified

    found = latest_verified(run_dir, warn=lambda message: None)
    return None if found is None else int(found.name.split("_")[1])


def interrupted_message(ctx: RunContext, how: str = "interrupted") -> str:
    """What Ctrl-C (or SIGTERM: `how` "terminated") left behind and the true way to go on."""
    if ctx.run_dir is None:
        return f"{how} before anything was written."
    if ctx.resumable:
        last = _last_logged(ctx.run_dir, "iteration")  # records count iterations from 0
        at = 0 if last is None else last + 1  # iterations done, as checkpoints and train.iterations count
        saved = _last_checkpoint(ctx.run_dir)
        if saved is None:
            return (
                f"{how} at iteration {at}; no checkpoint was saved yet, so the run cannot resume. "
                f"Fix: start again with another --out (add --checkpoint.every N to save during the run)."
            )
        since = "" if saved >= at else f" (from its checkpoint at iteration {saved})"
        return f"{how} at iteration {at}; resume with: rlhf train --resume {ctx.run_dir}{since}"
    if ctx.stage == "demo":
        return (
            f"{how}; the demo starts over when run again: `rlhf demo --out {ctx.run_dir}` clears its outputs."
        )
    step = _last_logged(ctx.run_dir, "step")
    at = f" (last logged step {step})" if step is not None else ""
    if (ctx.run_dir / "config.json").is_file():  # the signal waited for the final export (atomic)
        return (
            f"{how}{at} after the trained model was exported to {ctx.run_dir}; its report was not "
            f"written. Fix: `rlhf report {ctx.run_dir}` writes it."
        )
    return (
        f"{how}{at}; no model was exported to {ctx.run_dir} and `rlhf {ctx.stage}` cannot resume. "
        f"Fix: run the same command again with another --out (or delete {ctx.run_dir})."
    )


def write_error_log(ctx: RunContext, err: BaseException) -> Path:
    """Write the traceback of `err` into the run directory (or a temporary file); returns its path."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    if ctx.run_dir is not None and ctx.run_dir.is_dir():
        path = ctx.run_dir / ERROR_LOG
        try:
            path.write_text(text)
            return path
        except OSError:
            pass
    fd, name = tempfile.mkstemp(prefix=f"rlhf-{ctx.stage}-", suffix=".log")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return Path(name)


def internal_error_message(ctx: RunContext, err: BaseException) -> str:
    log = write_error_log(ctx, err)
    summary = str(err).splitlines()[0] if str(err) else ""
    return (
        f"internal error ({type(err).__name__}{': ' + summary if summary else ''}). "
        f"This is a bug in rlhf, not in your input; the traceback is in {log} (include it in a report)."
    )


def run_with_one_error_path(stage: str, command) -> int:
    """`command(ctx)`, every failure ending as one message on stderr and an exit code."""
    from rlhf.parallel.process_group import is_lost_peer, lost_peer_message, rank_label
    from rlhf.rundir.termination import Terminated, handle_sigterm

    ctx = RunContext(stage=stage)
    try:
        with handle_sigterm():  # SIGTERM (a scheduler's preemption) ends the run as Ctrl-C does
            return command(ctx)
    except Terminated:
        how = "terminated (SIGTERM)"
        message = resumable_supervised_interrupt(ctx, how) or interrupted_message(ctx, how)
        code = TERMINATED
    except KeyboardInterrupt:
        message = resumable_supervised_interrupt(ctx) or interrupted_message(ctx)
        code = INTERRUPTED
    except BrokenPipeError:  # the reader of our output closed it (`rlhf plan | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            raise  # argparse's own exits (--help, usage errors) keep their code
        message, code = str(stop.code), USER_ERROR
    except Exception as err:  # noqa: BLE001 (the one place that turns every failure into a message)
        if is_user_error(err):
            message, code = str(err), USER_ERROR
        elif is_lost_peer(err):  # torchrun: another rank died or hung; its own message names it
            message, code = lost_peer_message(err, ctx.run_dir if ctx.resumable else None), INTERNAL_ERROR
        elif is_no_space(err):
            message, code = no_space_message(ctx, err), USER_ERROR
        else:
            message, code = internal_error_message(ctx, err), INTERNAL_ERROR
    # one write: the ranks of a torchrun job share stderr, and print's separate newline could land
    # inside another rank's message
    sys.stderr.write(f"rlhf {stage}{rank_label()}: {message}\n")
    sys.stderr.flush()
    return code


def resumable_supervised_interrupt(ctx: RunContext, how: str = "interrupted") -> str | None:
    """Ctrl-C (or SIGTERM) in `rlhf dpo` after a checkpoint: the command that continues the run (None
    otherwise: `interrupted_message`, which says the run cannot resume)."""
    from rlhf.rundir.run_config import RESUMABLE_SUPERVISED

    if ctx.stage not in RESUMABLE_SUPERVISED or ctx.run_dir is None:
        return None
    steps = _last_checkpoint(ctx.run_dir)
    if steps is None:
        return None
    return (
        f"{how}; the newest checkpoint holds the first {steps} steps. Resume with: "
        f"rlhf {ctx.stage} --resume {ctx.run_dir}"
    )
