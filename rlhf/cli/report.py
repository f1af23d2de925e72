"""`rlhf report DIR`: write DIR/report.html for a demo output directory or any training run
directory (`rlhf sft`, `rlhf rm`, `rlhf train`); anything else is a user error naming the fix."""

from __future__ import annotations

from pathlib import Path

from rlhf.cli.flags import refuse_extra

DEMO_FILES = ("summary.json", "runs.json")


def add_parser(sub, description: str) -> None:
    report = sub.add_parser("report", help=description, description=description)
    report.add_argument(
        "directory", help="the --out directory of `rlhf sft`, `rlhf rm`, `rlhf train` or `rlhf demo`"
    )


def run_report_command(args, rest, ctx) -> int:
    refuse_extra(rest, "report")
    return run_report(args.directory)


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
