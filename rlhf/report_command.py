"""`rlhf report DIR`: write DIR/report.html for a demo output directory or any training run
directory (`rlhf sft`, `rlhf rm`, `rlhf train`); anything else is a user error naming the fix."""

from __future__ import annotations

from pathlib import Path

DEMO_FILES = ("summary.json", "runs.json")


def run_report(directory: str) -> int:
    d = Path(directory)
    try:
        if all((d / name).is_file() for name in DEMO_FILES):
            from rlhf.demo.run import rebuild_report

            return rebuild_report(directory)
        from rlhf.monitor.run_report import write_run_report

        print(f"report: {write_run_report(d)}")
    except PermissionError as err:
        from rlhf.config import ConfigError

        raise ConfigError(
            f"cannot write the report into {d} ({err.strerror}: {err.filename}). Fix: make the directory "
            f"writable, or copy the run directory somewhere writable and run `rlhf report` on the copy."
        ) from None
    return 0
