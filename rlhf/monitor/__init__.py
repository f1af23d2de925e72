"""Monitoring: metric sinks and progress display, the pattern-collapse detector, summaries and the
HTML report. Pure logging and plotting: imports nothing from the other layers of rlhf.

The report (matplotlib) is imported on first use, so a trainer that only logs does not pay for it.
"""

from __future__ import annotations

from typing import Any

from rlhf.monitor.collapse import CollapseDetector
from rlhf.monitor.console import DEFAULT_KEY_METRICS, ConsoleSink
from rlhf.monitor.logger import SINK_NAMES, MetricsLogger
from rlhf.monitor.records import read_metrics
from rlhf.monitor.sinks import JsonlSink, MissingDependencyError, TensorBoardSink, WandbSink
from rlhf.monitor.summary import print_summary

__all__ = [
    "CollapseDetector",
    "ConsoleSink",
    "DEFAULT_KEY_METRICS",
    "JsonlSink",
    "MetricsLogger",
    "MissingDependencyError",
    "SINK_NAMES",
    "TensorBoardSink",
    "WandbSink",
    "print_summary",
    "read_metrics",
    "write_report",
    "load_run",
]


def __getattr__(name: str) -> Any:
    if name in ("write_report", "load_run"):
        from rlhf.monitor import report

        return getattr(report, name)
    raise AttributeError(f"module 'rlhf.monitor' has no attribute {name!r}")
