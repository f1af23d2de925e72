"""A one-screen end-of-run summary as a rich table.

    print_summary("PPO-max, seed 0", {"gold": 0.61, "kl/ref": 3.9, "collapse": False})
    print_summary("final figures", [{"algorithm": "ppo", "gold": 0.2}, {"algorithm": "ppo_max", "gold": 0.6}])

A dict gives a two-column table (metric, value; nested dicts become "outer/inner" rows); a list of
dicts gives one row per dict and one column per key (in order of first appearance).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def format_cell(value: Any) -> str:
    """Numbers with 4 significant digits, (mean, std) pairs as "m ± s", None/NaN as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4g}"
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return f"{format_cell(float(value[0]))} ± {format_cell(float(value[1]))}"
    if hasattr(value, "item"):  # numpy / torch scalars
        return format_cell(value.item())
    return str(value)


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            rows.extend(_flatten(value, f"{prefix}{key}/"))
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def summary_table(title: str, rows_or_dict: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Table:
    """The rich Table of `print_summary` (without printing it)."""
    table = Table(title=title, title_style="bold", show_lines=False, header_style="bold cyan")
    if isinstance(rows_or_dict, Mapping):
        table.add_column("metric", style="bold")
        table.add_column("value", justify="right")
        for key, value in _flatten(rows_or_dict):
            table.add_row(key, format_cell(value))
        return table
    if isinstance(rows_or_dict, (str, bytes)) or not isinstance(rows_or_dict, Sequence):
        raise TypeError(
            f"print_summary: expected a dict or a list of dicts, got {type(rows_or_dict).__name__}"
        )
    columns: list[str] = []
    flat_rows = []
    for row in rows_or_dict:
        if not isinstance(row, Mapping):
            raise TypeError(f"print_summary: every row must be a dict, got {type(row).__name__}")
        flat = dict(_flatten(row))
        flat_rows.append(flat)
        columns.extend(key for key in flat if key not in columns)
    for index, column in enumerate(columns):
        table.add_column(
            column, justify="left" if index == 0 else "right", style="bold" if index == 0 else None
        )
    for flat in flat_rows:
        table.add_row(*(format_cell(flat.get(column)) for column in columns))
    return table


def print_summary(
    title: str,
    rows_or_dict: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    path: str | os.PathLike | None = None,
    console: Console | None = None,
) -> str:
    """Print the summary table; also write it as plain text to `path` if given. Returns the plain text."""
    table = summary_table(title, rows_or_dict)
    console = console if console is not None else Console()
    console.print(table)
    recorder = Console(record=True, width=max(console.width, 100), file=io.StringIO(), color_system=None)
    recorder.print(table)
    text = recorder.export_text()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    return text
