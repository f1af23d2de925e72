"""What a command may write, decided before any work.

- `check_out_holds_nothing_of_yours`: a fresh run's `--out` is new, empty, or a run directory an
  earlier `rlhf` command left (its lock file, its records); a folder of anything else (a model
  directory, a project folder, the folder of the `--config` file) is refused, since the run writes
  `config.yaml`, `report.html` and model files there.
- `check_result_writable`: the folder of a JSON result (`eval.json`, `rm_eval.json`, the default
  ones beside an input model too) can be made and written.
- `keep_unwritable_result`: when the final write still fails, the finished result is written to a
  temporary file whose path the message names, so no work is lost.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from rlhf.config import ConfigError
from rlhf.monitor.logger import METRICS_FILE
from rlhf.rundir.directory import check_writable_dir
from rlhf.rundir.lock import LOCK_FILE
from rlhf.rundir.out_path import classify_out

# What an `rlhf` run leaves in its --out before its metrics exist (a run stopped early); a folder
# holding only these and the lock file is that run's, and a new run may take it over.
RUN_LEFTOVERS = frozenset(
    {LOCK_FILE, METRICS_FILE, "config.yaml", "run_inputs.json", "error.log", "checkpoints", "samples.jsonl"}
)


# What `rlhf demo` writes into its --out (and clears on a re-run: rlhf/demo/run.py clear_demo_outputs)
DEMO_OUTPUTS = frozenset(
    {LOCK_FILE, "error.log", "world", "sft", "rm", "runs", "summary.json", "runs.json", "report.html",
     "report_overview.png"}
)  # fmt: skip

# What `rlhf ablate` writes into its --out (rlhf/demo/ablate/runner.py: the demo's stage, then a run
# per variant and seed; a re-run resumes from them and clears world/, sft/, rm/ and runs/ when it has
# no stage.json)
ABLATE_OUTPUTS = frozenset(
    {LOCK_FILE, "error.log", "world", "sft", "rm", "runs", "stage.json", "ablation.json", "report.html",
     "ablation.md"}
)  # fmt: skip

# what each command that owns a whole --out writes there, for the refusal's words
_WRITES = {
    "demo": "its world, models, runs and report.html",
    "ablate": "its world, models, a run per variant and seed, ablation.json and report.html (and clears "
    "world/, sft/, rm/ and runs/ first)",
}


def check_out_holds_nothing_of_yours(
    out: str | Path,
    command: str,
    config_file: str | None = None,
    leftovers: frozenset[str] = RUN_LEFTOVERS,
    every_output: bool = False,
) -> None:
    """Raise ConfigError, before any work, when the fresh run's `--out` holds something of the
    user's: the `--config` file itself, or files no earlier `rlhf` run left there (`leftovers`: the
    names an earlier run of `command` leaves, beside its lock file; `every_output`: they are all it
    writes, so a folder of those names alone is an earlier run of it, finished or not, which it
    resumes)."""
    target = Path(out)
    if config_file:
        config_path = Path(config_file).resolve()
        if target.resolve() in config_path.parents:
            raise ConfigError(
                f"--out {out} holds the --config file {config_file}: the run writes its own config.yaml, "
                f"report.html and model there. Fix: --out a directory of its own (e.g. {target / 'runs' / command})."
            )
    found = classify_out(out, command)
    if found.kind in ("missing", "dangling_link", "file", "empty"):
        return  # nothing of the user's (check_out_dir refuses a file or a link)
    if found.kind == "run" and METRICS_FILE in found.entries:
        return  # a run of this stage that ran: check_fresh_run_dir offers --resume or another --out
    if found.kind == "other_run":
        resume = f"rlhf {found.stage} --resume {out}" if found.stage in ("train", "dpo") else ""
        raise ConfigError(
            f"--out {out} is a run directory of `rlhf {found.stage}`, not of `rlhf {command}`: `rlhf {command}` "
            f"would write its config.yaml, metrics and model over that run's. Fix: --out a new directory (e.g. "
            f"runs/{command}){f'; to continue that run: {resume}' if resume else ''}."
        )
    if not target.is_dir():
        return
    entries = list(found.entries)
    foreign = [name for name in entries if name not in leftovers]
    if not foreign and (every_output or LOCK_FILE in entries):
        return  # an earlier run of `command` (stopped before its work: its metrics file says whether it ran)
    shown = ", ".join(foreign[:5] or entries[:5]) + (" ..." if len(foreign or entries) > 5 else "")
    what = "a model directory" if "config.json" in entries else f"a folder no `rlhf {command}` made"
    writes = _WRITES.get(command, "config.yaml, metrics, report.html and model files")
    raise ConfigError(
        f"--out {out} is {what} and not empty ({shown}): `rlhf {command}` writes {writes} there, replacing "
        f"what has those names. Fix: --out a new or empty directory (e.g. {target / command} or runs/NAME)."
    )


def check_result_writable(path: str | Path, flag: str = "--out", default_note: str = "") -> None:
    """Raise ConfigError, before any work, when the folder of the result file `path` cannot be made or
    written (`default_note`: why it is there when no --out was given, e.g. "beside --policy")."""
    path = Path(path)
    try:
        check_writable_dir(path.parent)
    except ConfigError as err:
        where = f"the default {path.name} ({default_note}) at {path}" if default_note else f"{flag} {path}"
        reason = str(err).split(" cannot be written: ", 1)[-1].split(". Fix:", 1)[0]
        raise ConfigError(
            f"{where} cannot be written: {reason}. Fix: pass --out a file in a folder you may write "
            f"(e.g. --out results/{path.name})."
        ) from None


def keep_unwritable_result(path: str | Path, result: dict, err: OSError) -> ConfigError:
    """Write the finished `result` to a temporary file when `path` cannot be written after all; the
    error names both paths."""
    fd, kept = tempfile.mkstemp(prefix=f"rlhf-{Path(path).stem}-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return ConfigError(
        f"{path} could not be written at the end ({err.strerror or err}); the finished result is kept in "
        f"{kept}. Fix: copy it where you want it (cp {kept} DEST), and pass a writable --out next time."
    )
