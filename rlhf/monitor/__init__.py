"""Monitoring: metric sinks and progress display, the pattern-collapse detector, summaries, and a run
directory's HTML report (run_report.py, `rlhf report`; the demo's report is rlhf/demo/report.py).
Pure logging and plotting: imports nothing from the other layers of rlhf.

The plots (matplotlib) are imported by the reports only, so a trainer that only logs does not pay for them.
"""

from __future__ import annotations

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
]
