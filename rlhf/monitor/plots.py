"""Figures of the report, drawn with matplotlib's object API on the Agg canvas (no pyplot, no display).

Each function takes plain arrays already grouped by algorithm and returns a `Figure`;
`figure_png` renders it to PNG bytes, `save_figure` writes it to a file, `png_data_uri` embeds it.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DPI = 80


@dataclass
class Band:
    """One curve aggregated over seeds: the mean and the min-max band at each x."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray  # how many seeds contributed at each x


def aggregate(series: Sequence[Sequence[tuple[float, float]]]) -> Band | None:
    """Mean and min-max over seeds of (x, y) series, on the union of their x values (None if empty)."""
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            by_x.setdefault(float(x), []).append(float(y))
    if not by_x:
        return None
    xs = sorted(by_x)
    values = [np.asarray(by_x[x]) for x in xs]
    return Band(
        x=np.asarray(xs),
        mean=np.asarray([v.mean() for v in values]),
        low=np.asarray([v.min() for v in values]),
        high=np.asarray([v.max() for v in values]),
        n=np.asarray([v.size for v in values]),
    )


def color_map(algorithms: Sequence[str]) -> dict[str, str]:
    """A stable color per algorithm, in the given order."""
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(algorithms)}


def _new_figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def _grid(
    figure: Figure, rows: int, columns: int, legend_inches: float = 0.0, sharey: bool = False
) -> np.ndarray:
    """Axes on fixed margins and gaps in inches (a layout engine costs more time than the drawing)."""
    width, height = figure.get_size_inches()
    left, right, top, bottom = 0.55, 0.15, 0.3, 0.45 + legend_inches
    gap_x, gap_y = 0.55, 0.8  # room for tick labels, and for an x label plus the next title
    axis_width = (width - left - right - (columns - 1) * gap_x) / columns
    axis_height = (height - top - bottom - (rows - 1) * gap_y) / rows
    figure.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        top=1 - top / height,
        bottom=bottom / height,
        wspace=gap_x / axis_width,
        hspace=gap_y / axis_height,
    )
    return figure.subplots(rows, columns, squeeze=False, sharey=sharey).ravel()


def curves_figure(
    bands: Mapping[str, Mapping[str, Band]],
    panels: Sequence[tuple[str, str]],
    colors: Mapping[str, str],
    markers: Mapping[str, Sequence[float]] | None = None,
    xlabel: str = "iteration",
    columns: int = 3,
) -> Figure:
    """A grid of panels (name, title); each shows every algorithm's mean line and min-max band.

    `markers[algorithm]` are x positions (collapse warnings) drawn as dashed vertical lines.
    """
    rows = max(1, -(-len(panels) // columns))
    figure = _new_figure(3.6 * columns, 2.6 * rows + 0.35)
    axes = _grid(figure, rows, columns, legend_inches=0.35)
    for axis, (name, title) in zip(axes, panels):
        axis.set_title(title, fontsize=10)
        axis.set_xlabel(xlabel, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        drawn = False
        for algorithm, per_panel in bands.items():
            band = per_panel.get(name)
            if band is None:
                continue
            drawn = True
            color = colors[algorithm]
            axis.plot(band.x, band.mean, color=color, lw=1.6, label=algorithm)
            if (band.n > 1).any():
                axis.fill_between(band.x, band.low, band.high, color=color, alpha=0.18, lw=0)
            for x in (markers or {}).get(algorithm, ()):
                axis.axvline(x, color=color, ls="--", lw=1.0, alpha=0.7)
        if not drawn:
            axis.text(
                0.5, 0.5, "not recorded", ha="center", va="center", transform=axis.transAxes, color="0.5"
            )
    for axis in axes[len(panels) :]:
        axis.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    if markers and any(markers.get(algorithm) for algorithm in bands):
        handles.append(Line2D([], [], color="0.3", ls="--", lw=1.0))
        labels.append("collapse warning")
    if handles:
        figure.legend(
            handles, labels, loc="lower center", ncols=min(len(labels), 6), fontsize=8, frameon=False
        )
    return figure


def monitor_figure(
    panels: Sequence[tuple[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]],
    markers: Sequence[float] = (),
    xlabel: str = "step",
    columns: int = 4,
) -> Figure:
    """Small multiples of one run: a panel per (title, {line label: (x, y)}), few ticks (a figure of
    many panels renders in a fraction of the default tick cost). `markers`: x positions drawn as
    dashed vertical lines (collapse warnings) on every panel."""
    columns = max(1, min(columns, len(panels)))
    rows = max(1, -(-len(panels) // columns))
    figure = _new_figure(3.0 * columns, 2.2 * rows + 0.1)
    axes = _grid(figure, rows, columns)
    for axis, (title, lines) in zip(axes, panels):
        axis.set_title(title, fontsize=9)
        axis.set_xlabel(xlabel, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        axis.yaxis.set_major_locator(MaxNLocator(nbins=4))
        axis.grid(alpha=0.3)
        for index, (label, (x, y)) in enumerate(lines.items()):
            axis.plot(
                x,
                y,
                color=PALETTE[index % len(PALETTE)],
                lw=1.4,
                label=label,
                marker="o" if len(x) < 3 else None,
                ms=3,
            )
        for x in markers:
            axis.axvline(x, color="0.3", ls="--", lw=1.0, alpha=0.7)
        if len(lines) > 1:
            axis.legend(fontsize=7, frameon=False)
    for axis in axes[len(panels) :]:
        axis.set_visible(False)
    return figure


def frontier_figure(
    frontier: Mapping[str, tuple[np.ndarray, np.ndarray]],
    seed_points: Mapping[str, tuple[np.ndarray, np.ndarray]],
    colors: Mapping[str, str],
    reference_gold: float | None = None,
) -> Figure:
    """Gold reward against KL: one curve per algorithm (seed means over training), seeds as dots."""
    figure = _new_figure(5.6, 3.8)
    (axis,) = _grid(figure, 1, 1)
    for algorithm, (kl, gold) in frontier.items():
        color = colors[algorithm]
        axis.plot(kl, gold, color=color, lw=1.6, marker="o", ms=3, label=algorithm)
        if len(kl):
            axis.plot(kl[-1:], gold[-1:], color=color, marker="*", ms=11, ls="none")
        seed_kl, seed_gold = seed_points.get(algorithm, (np.empty(0), np.empty(0)))
        axis.scatter(seed_kl, seed_gold, color=color, s=8, alpha=0.3, lw=0)
    if reference_gold is not None:
        axis.axhline(reference_gold, color="0.4", ls=":", lw=1.2, label="SFT gold")
    axis.set_xlabel("KL to reference", fontsize=9)
    axis.set_ylabel("gold reward", fontsize=9)
    axis.set_title("gold reward against KL (star: end of training)", fontsize=10)
    axis.tick_params(labelsize=8)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, frameon=False)
    return figure


def reward_distribution_figure(
    buckets: Mapping[str, Sequence[tuple[str, np.ndarray]]],
    colors: Mapping[str, str],
) -> Figure:
    """Per algorithm, a box per bucket of training iterations (whiskers 5-95%, outliers as dots).

    A tail of outliers growing on one side is the long-tailed reward of reward hacking (PPO paper
    §5.2 and its appendix A).
    """
    count = max(len(buckets), 1)
    columns = min(count, 2)
    rows = -(-count // columns)
    figure = _new_figure(5.2 * columns, 2.8 * rows)
    axes = _grid(figure, rows, columns, sharey=True)
    for axis, (algorithm, groups) in zip(axes, buckets.items()):
        labels = [label for label, _ in groups]
        data = [np.asarray(scores, dtype=float) for _, scores in groups]
        color = colors[algorithm]
        axis.boxplot(
            data,
            tick_labels=labels,
            whis=(5, 95),
            patch_artist=True,
            boxprops={"facecolor": color, "alpha": 0.35},
            medianprops={"color": color, "lw": 1.6},
            flierprops={"marker": ".", "markersize": 3, "alpha": 0.5},
        )
        axis.set_title(f"{algorithm}: reward per iteration bucket", fontsize=10)
        axis.set_xlabel("iterations", fontsize=8)
        axis.set_ylabel("reward", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3, axis="y")
    for axis in axes[len(buckets) :]:
        axis.set_visible(False)
    return figure


def figure_png(figure: Figure, dpi: int = DPI) -> bytes:
    """Render a figure to PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_figure(figure: Figure, path: str | os.PathLike, dpi: int = DPI) -> Path:
    """Write a figure as PNG to `path` (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(figure_png(figure, dpi))
    return path


def png_data_uri(png: bytes) -> str:
    """A `data:` URI embedding PNG bytes (for a self-contained HTML file)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
