"""The report a training command writes at the end of its run. A report is a convenience: when it
cannot be written the run is still complete, so the failure is a warning, never an error."""

from __future__ import annotations

import sys
from pathlib import Path


def write_final_report(run_dir: str | Path) -> str:
    """Write `run_dir/report.html`; return what the final summary shows under "report": its path,
    or why there is none (the reason is also printed to stderr as a warning)."""
    try:
        from rlhf.monitor.run_report import write_run_report

        return str(write_run_report(run_dir))
    except Exception as err:  # noqa: BLE001 (whatever breaks the report must not fail a finished run)
        reason = f"{type(err).__name__}: {err}".splitlines()[0]
        print(
            f"warning: the run finished, but its report could not be written ({reason}). "
            f"Retry with: rlhf report {run_dir}",
            file=sys.stderr,
        )
        return f"not written ({reason})"
