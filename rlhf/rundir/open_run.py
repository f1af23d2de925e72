"""Opening a run directory, fresh or resumed, the same way for `rlhf sft`, `rm`, `dpo` and `train`:
    with open_run(RunRequest(stage, ConfigClass, ...), ctx) as run:
        stage_body(run.config, resume=run.resumed)
In order, each step before any model loads: the config (run_config.py), the preflight checks
(preflight.py), a fresh run's `--out` (neither a file nor a model it reads: directory.py), the
data-parallel group, then on rank 0 alone (its verdict shared by every rank) `--out` free of
anything of the user's and of an earlier run (outputs.py, directory.py), the one-writer lock
(lock.py), and the models a fresh run starts from recorded (run_inputs.py) or, on resume, the
newest complete checkpoint found and the models unchanged since the start. (`rlhf demo` and
`rlhf ablate` own their output folders: `open_output_dir`.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.config import ConfigError
from rlhf.rundir import preflight as checks
from rlhf.rundir.run_config import RESUMABLE_SUPERVISED, RunRequest, model_flags, run_config


@dataclass
class RunContext:
    """What the error path knows of the command being run (rlhf/cli/errors.py)."""

    stage: str
    run_dir: Path | None = None  # set once the run directory is known (and locked)
    resumable: bool = False  # `rlhf train`: a checkpoint can be continued with --resume


@dataclass(frozen=True)
class OpenRun:
    config: Any  # the stage's validated config
    dir: Path  # its run directory, locked
    resumed: bool  # --resume: continue from the newest complete checkpoint


@contextmanager
def open_run(request: RunRequest, ctx: RunContext) -> Iterator[OpenRun]:
    """Open the run `request` asks for; `ctx.run_dir` is set once the directory is locked."""
    from rlhf.parallel.process_group import agreed_on_rank0, data_parallel
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import writer_lock

    ctx.resumable = request.stage == "train"
    config = run_config(request)
    checks.preflight(config)
    if request.fit_to_machine is not None:
        said = request.fit_to_machine(config, _explicit_keys(request))
        if said:
            print(said, file=sys.stderr)
    if not request.resume:
        check_out_dir(config.out, model_flags(request.stage, config))
    with data_parallel(config.dist, config.train.device):
        if not request.resume:  # rank 0 alone reads --out (another rank could see rank 0's first files)
            agreed_on_rank0(lambda: check_fresh_out(config.out, request.stage, request.file))
        with writer_lock(config.out) as ctx.run_dir:
            if request.resume:  # rank 0 checks (and tidies) the run directory; every rank stops if it refuses
                agreed_on_rank0(lambda: check_resume(config, ctx.run_dir, request))
            elif request.stage != "train":  # train's body records them once its trainer is built
                from rlhf.rundir.run_inputs import model_inputs, record_models

                # the model files it starts from, before they are read: a resume checks them
                agreed_on_rank0(lambda: record_models(config.out, model_inputs(config)))
            yield OpenRun(config, ctx.run_dir, resumed=bool(request.resume))


def _explicit_keys(request: RunRequest) -> set[str]:
    """The dotted keys the user set (--config file, flags): values `fit_to_machine` keeps."""
    from rlhf.config import read_yaml
    from rlhf.rundir.resume import flatten_keys

    explicit = set(flatten_keys(request.overrides))
    if request.file:
        explicit |= set(flatten_keys(read_yaml(request.file)))
    return explicit


def check_fresh_out(out: str, stage: str, config_file: str | None) -> None:
    """A fresh run's --out: no earlier run's metrics (resume or another --out), nothing of the user's."""
    from rlhf.rundir.directory import check_fresh_run_dir
    from rlhf.rundir.lock import refuse_if_in_use
    from rlhf.rundir.outputs import check_out_holds_nothing_of_yours

    refuse_if_in_use(out)  # a run writing there now is said first
    check_out_holds_nothing_of_yours(out, stage, config_file)  # another stage's run, a model, your files
    check_fresh_run_dir(out, resumable=stage in ("train", *RESUMABLE_SUPERVISED))


def check_resume(config, run_dir: Path, request: RunRequest) -> None:
    """Remove what killed checkpoint writes left and set damaged newest checkpoints aside (warning
    about each), so the run resumes from the newest complete one; its models are the files it
    started from (run_inputs.json), or the user accepted the change."""
    from rlhf.rundir import checkpoint as ckpt
    from rlhf.rundir.run_inputs import check_models

    ckpt.clean_stale(run_dir)
    problems: list[str] = []

    def warn(message: str) -> None:
        problems.append(message)
        print(f"warning: {message}", file=sys.stderr)

    if ckpt.set_aside_damaged(run_dir, warn) is None:
        found = "; ".join(problems) or "there is no checkpoints/iter_* directory"
        raise ConfigError(
            f"{run_dir} has no complete checkpoint to resume from ({found}). Fix: start a fresh run with "
            "another --out (add --checkpoint.every N to save during the run)."
        )
    latest = ckpt.latest_verified(run_dir, warn=lambda message: None)
    check_models(
        config,
        run_dir,
        allow_changed=request.allow_changed_models,
        iteration=None if latest is None else int(latest.name.split("_")[1]),
        warn=lambda message: print(message, file=sys.stderr),
        command=f"rlhf {request.stage}",
    )


@contextmanager
def open_output_dir(
    out: str, stage: str, config_file: str | None, ctx: RunContext, leftovers, every_output: bool = False
) -> Iterator[Path]:
    """`rlhf demo` (it clears its earlier outputs) and `rlhf ablate` (it resumes from its own outputs):
    `out` locked, never a file or a folder of anything else (`leftovers`: the names its runs leave)."""
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import refuse_if_in_use, run_dir_lock
    from rlhf.rundir.outputs import check_out_holds_nothing_of_yours

    check_out_dir(out, {})  # an existing file, a read-only or impossible path
    refuse_if_in_use(out)
    check_out_holds_nothing_of_yours(out, stage, config_file, leftovers=leftovers, every_output=every_output)
    with run_dir_lock(out) as ctx.run_dir:
        yield ctx.run_dir
