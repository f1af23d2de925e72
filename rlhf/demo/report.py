"""The self-contained `report.html` of a demo: every figure embedded as a base64 PNG, inline CSS,
no scripts and no external assets (it opens offline and can be mailed as one file).

    write_report(path, summary, runs, title="rlhf demo report", notes=None, *,
                 metric_keys=DEFAULT_METRIC_KEYS, max_samples=5, reward_buckets=6) -> Path

The input contract (`summary`, `runs`) and the sections, always present in the order `SECTIONS`,
are in `write_report`'s docstring."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.monitor import plots
from rlhf.monitor.html_parts import Html as _Html
from rlhf.monitor.html_parts import NumText as _NumText
from rlhf.monitor.html_parts import esc as _esc
from rlhf.monitor.html_parts import fmt as _fmt
from rlhf.monitor.html_parts import img as _img
from rlhf.monitor.html_parts import note as _note
from rlhf.monitor.html_parts import num as _num
from rlhf.monitor.html_parts import page, pooled_reward_buckets
from rlhf.monitor.html_parts import table as _table
from rlhf.monitor.records import read_metrics

SECTIONS = (  # the verdict first, the settings last
    "Findings",
    "Final figures",
    "Curves",
    "Gold reward against KL",
    "Training monitors",
    "Reward distribution over training",
    "Sample responses",
    "Collapse warnings",
    "Settings",
)
OVERVIEW_PNG = "report_overview.png"

# the names of the evaluation figures -> the keys of the per-iteration training records
DEFAULT_METRIC_KEYS: dict[str, str] = {
    "proxy": "reward/proxy_mean",
    "gold": "eval/gold",
    "kl": "kl/ref",
    "ppl": "policy_ppl",
    "length": "response_length",
    "distinct2": "eval/distinct2",
}
PANEL_TITLES: dict[str, str] = {
    "proxy": "proxy reward (reward model)",
    "gold": "gold reward",
    "kl": "KL to reference",
    "ppl": "policy perplexity (own responses)",
    "length": "response length (tokens)",
    "distinct2": "distinct-2 (diversity)",
}
# the eval keys a trainer writes into metrics.jsonl, read by `load_run`
DEFAULT_EVAL_KEYS: dict[str, str] = {name: f"eval/{name}" for name in PANEL_TITLES}


def _fmt_mean_std(values: Sequence[float]) -> str:
    if not values:
        return _NumText("-")
    if len(values) == 1:
        return _NumText(_fmt(values[0]))
    return _NumText(f"{_fmt(statistics.fmean(values))} ± {_fmt(statistics.stdev(values), 2)}")


# -- data shaping ---------------------------------------------------------------------------------


def _validate(summary: Any, runs: Any) -> None:
    if isinstance(summary, (list, tuple)) and isinstance(runs, Mapping):
        raise TypeError(
            "write_report(path, summary: dict, runs: list): the summary and runs arguments look swapped"
        )
    if not isinstance(summary, Mapping):
        raise TypeError(f"write_report: summary must be a dict, got {type(summary).__name__}")
    if not isinstance(runs, (list, tuple)):
        raise TypeError(f"write_report: runs must be a list of dicts, got {type(runs).__name__}")
    for index, run in enumerate(runs):
        if not isinstance(run, Mapping) or not isinstance(run.get("algorithm"), str):
            raise ValueError(f"write_report: runs[{index}] must be a dict with an 'algorithm' string")


def _points(records: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float, float]]:
    points = []
    for record in records or ():
        x, y = _num(record.get("iteration", record.get("step"))), _num(record.get(key))
        if x is not None and y is not None:
            points.append((x, y))
    return points


def _eval_series(
    run: Mapping[str, Any], metric_keys: Mapping[str, str]
) -> dict[str, list[tuple[float, float]]]:
    """Per name (proxy, gold, ...): (iteration, value) from "eval", else from "metrics" via metric_keys."""
    if run.get("eval"):
        return {name: _points(run["eval"], name) for name in PANEL_TITLES}
    return {name: _points(run.get("metrics") or (), metric_keys.get(name, name)) for name in PANEL_TITLES}


def _groups(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run["algorithm"], []).append(run)
    return groups


def _x_axis(group: Sequence[Mapping[str, Any]]) -> str:
    return str(group[0].get("x_axis") or "iteration")


def _warning_iterations(runs: Sequence[Mapping[str, Any]]) -> list[float]:
    found = {
        _num(w.get("iteration")) for run in runs for w in run.get("warnings") or () if isinstance(w, Mapping)
    }
    return sorted(x for x in found if x is not None)


def _bands(groups, series_of) -> dict[str, dict[str, plots.Band]]:
    bands: dict[str, dict[str, plots.Band]] = {}
    for algorithm, group in groups.items():
        per_run = [series_of(run) for run in group]
        names = {name for series in per_run for name in series}
        bands[algorithm] = {}
        for name in names:
            band = plots.aggregate([series.get(name, []) for series in per_run])
            if band is not None:
                bands[algorithm][name] = band
    return bands


def _run_entries(summary: Mapping[str, Any], runs, metric_keys) -> list[Mapping[str, Any]]:
    """summary["runs"], or the same figures derived from each run's last evaluation."""
    if summary.get("runs"):
        return list(summary["runs"])
    entries = []
    for run in runs:
        series = _eval_series(run, metric_keys)
        final = {name: points[-1][1] for name, points in series.items() if points}
        golds = [y for _, y in series.get("gold", [])]
        iterations = [x for points in series.values() for x, _ in points]
        iterations += [x for x, _ in _points(run.get("metrics") or (), "iteration")]
        entries.append(
            {
                "algorithm": run["algorithm"],
                "seed": run.get("seed"),
                "final": final,
                "peak_gold": max(golds) if golds else None,
                "collapse_detected": bool(run.get("warnings")),
                "iterations": int(max(iterations)) if iterations else None,
            }
        )
    return entries


# -- sections ---------------------------------------------------------------------------------------


def _overview(summary: Mapping[str, Any], runs, notes: Sequence[str] | None) -> str:
    parts = []
    groups = _groups(runs)
    if groups:
        what = ", ".join(
            f"{algorithm} ({len(group)} seed{'s' if len(group) > 1 else ''}: "
            f"{', '.join(str(run.get('seed', '?')) for run in group)})"
            for algorithm, group in groups.items()
        )
        parts.append(f"<p><b>Runs:</b> {_esc(what)}.</p>")
    else:
        parts.append(_note("No runs were given."))
    rows = []
    sft = summary.get("sft") or {}
    if sft:
        gold = _fmt(sft.get("gold_mean"))
        if _num(sft.get("gold_std")) is not None:
            gold += f" ± {_fmt(sft['gold_std'], 3)}"
        rows += [("SFT policy", "gold reward (mean ± std over responses)", _NumText(gold))]
        rows += [("SFT policy", "proxy reward (mean)", _NumText(_fmt(sft.get("proxy_mean"))))]
    rm = summary.get("reward_model") or {}
    for key, label in (
        ("label_accuracy", "accuracy on held-out preference labels"),
        ("gold_accuracy", "agreement with the gold ordering"),
    ):
        if _num(rm.get(key)) is not None:
            rows.append(("reward model", label, _NumText(f"{100 * rm[key]:.1f}%")))
    findings = summary.get("findings") or []
    if findings:
        held = sum(bool(f.get("holds")) for f in findings)
        parts.append(f"<h3>Findings ({held}/{len(findings)} hold)</h3>")
        table_rows = [
            (
                f.get("claim", ""),
                _Html(
                    '<span class="pass">PASS</span>' if f.get("holds") else '<span class="fail">FAIL</span>'
                ),
                f.get("evidence", ""),
            )
            for f in findings
        ]
        parts.append(_table(("claim", "result", "evidence"), table_rows))
    parts.append(
        _table(("model", "figure", "value"), rows)
        if rows
        else _note("No SFT or reward-model figures recorded.")
    )
    if notes:
        parts.append("<ul>" + "".join(f"<li>{_esc(n)}</li>" for n in notes) + "</ul>")
    return "".join(parts)


def _settings(summary: Mapping[str, Any]) -> str:
    """The settings the runs were made with (the world's), folded: the page opens on the verdict."""
    world = summary.get("world")
    if isinstance(world, Mapping):
        rows = [(k, v) for k, v in world.items()]
        return (
            f"<details><summary>World: {len(rows)} settings</summary>"
            + _table(("key", "value"), rows)
            + "</details>"
        )
    if world is not None:
        return f"<p><b>World:</b> {_esc(world)}</p>"
    return _note("No settings recorded.")


def _final_table(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return _note("No final figures recorded.")
    names = ("proxy", "gold", "kl", "ppl", "length", "distinct2")
    with_steps = any(_num(e.get("steps")) is not None for e in entries)  # runs without iterations
    by_algorithm: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        by_algorithm.setdefault(str(entry.get("algorithm", "?")), []).append(entry)
    rows = []
    for algorithm, group in by_algorithm.items():
        row: list[Any] = [algorithm, len(group)]
        for name in names:
            row.append(
                _fmt_mean_std(
                    [v for v in (_num((e.get("final") or {}).get(name)) for e in group) if v is not None]
                )
            )
        for key in ("peak_gold", "iterations", *(("steps",) if with_steps else ()), "seconds"):
            row.append(_fmt_mean_std([v for v in (_num(e.get(key)) for e in group) if v is not None]))
        watched = [e.get("collapse_detected") for e in group if e.get("collapse_detected") is not None]
        fired = sum(bool(w) for w in watched)
        row.append(_NumText(f"{fired}/{len(watched)}" if watched else "-"))
        rows.append(row)
    headers = (
        "algorithm",
        "seeds",
        "proxy",
        "gold",
        "KL",
        "perplexity",
        "length",
        "distinct-2",
        "peak gold",
        "iterations",
        *(("steps",) if with_steps else ()),
        "seconds",
        "collapse",
    )
    return _note("Mean ± std over seeds at the end of training.") + _table(headers, rows)


def _interval(stat: Any) -> _NumText:
    if not isinstance(stat, Mapping) or _num(stat.get("mean")) is None:
        return _NumText("-")
    ci = stat.get("ci95")
    text = _fmt(stat["mean"])
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        text += f" [{_fmt(ci[0])}, {_fmt(ci[1])}]"
    return _NumText(text)


def _equal_kl_table(equal_kl: Any) -> str:
    """summary["equal_kl"]: each algorithm's gold gain where its KL first reaches the budget."""
    if not isinstance(equal_kl, Mapping) or not equal_kl.get("algorithms"):
        return ""
    rows = [
        (
            algorithm,
            _interval(row.get("gold_gain_at_kl")),
            _NumText(str(row.get("reached_kl_budget", "-"))),
            _interval(row.get("gold_gain_end")),
            _interval(row.get("kl_end")),
        )
        for algorithm, row in equal_kl["algorithms"].items()
    ]
    budget = _fmt(equal_kl.get("kl_budget"))
    headers = (
        "algorithm",
        f"gold gain at KL {budget}",
        "runs reaching it",
        "gold gain at the end",
        "KL at the end",
    )
    return _note(
        f"At equal KL: gold gain over SFT where each run's KL first reaches {budget} (interpolated "
        "between evaluations; a run that never reaches it gives its last figure), mean [95% t "
        "interval] over seeds."
    ) + _table(headers, rows)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, Mapping) else str(m)
            for m in prompt
        )
    return "" if prompt is None else str(prompt)


def _samples(runs, max_samples: int) -> str:
    parts = []
    for run in runs:
        samples = run.get("samples") or {}
        if not any(samples.get(when) for when in ("start", "end")):
            continue
        parts.append(f"<h3>{_esc(run['algorithm'])}, seed {_esc(run.get('seed', '?'))}</h3>")
        for when, label in (("start", "start of training"), ("end", "end of training")):
            chosen = list(samples.get(when) or ())[:max_samples]
            if not chosen:
                parts.append(_note(f"No samples at the {label}."))
                continue
            rows = [
                (_prompt_text(s.get("prompt")), str(s.get("response", "")), s.get("proxy"), s.get("gold"))
                for s in chosen
            ]
            parts.append(
                f"<p><b>{_esc(label)}</b></p>"
                + _table(("prompt", "response", "proxy", "gold"), rows, text_columns=(0, 1))
            )
    return "".join(parts) if parts else _note("No sample responses recorded.")


def _warnings(runs) -> str:
    rows = [
        (run["algorithm"], run.get("seed", "?"), w.get("iteration"), w.get("message", ""))
        for run in runs
        for w in run.get("warnings") or ()
        if isinstance(w, Mapping)
    ]
    if not rows:
        return _note(
            "No collapse warnings: the detector never saw KL rise, perplexity fall and length drift together."
        )
    intro = _note(
        "Dashed vertical lines on the curves mark these iterations (PPO paper §5.2, pattern collapse)."
    )
    return intro + _table(("algorithm", "seed", "iteration", "warning"), rows, text_columns=(3,))


# -- entry points -----------------------------------------------------------------------------------


def write_report(
    path: str | os.PathLike,
    summary: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    title: str = "rlhf demo report",
    notes: Sequence[str] | None = None,
    *,
    metric_keys: Mapping[str, str] = DEFAULT_METRIC_KEYS,
    max_samples: int = 5,
    reward_buckets: int = 6,
) -> Path:
    """Write the self-contained report to `path` and `report_overview.png` beside it.

    `summary` (dict; every key optional, extra keys allowed and ignored unless listed here):

        {
          "world": str | dict,                        # what was trained on, shown in the overview
          "sft": {"gold_mean", "gold_std", "proxy_mean"},
          "reward_model": {"label_accuracy", "gold_accuracy"},          # fractions in [0, 1]
          "runs": [{"algorithm", "seed",
                    "final": {"proxy", "gold", "kl", "ppl", "length", "distinct2"},
                    "peak_gold", "collapse_detected", "iterations", "seconds"}],
          "findings": [{"claim": str, "holds": bool, "evidence": str}],
          "equal_kl": {"kl_budget": float, "algorithms": {algorithm: {
                        "gold_gain_at_kl", "gold_gain_end", "kl_end": {"mean", "ci95"},
                        "reached_kl_budget": "k/n"}}},
        }

    A run without iterations (DPO) has "steps" in place of "iterations" and "collapse_detected": None
    (no detector watched it).

    `runs` (list, one dict per algorithm x seed; only "algorithm" is required):

        {
          "algorithm": str, "seed": int,
          "x_axis": str,                              # what "eval" is recorded against: "iteration"
                                                      # (default), or e.g. "optimizer step" (DPO)
          "metrics": [{"iteration": int, "reward/proxy_mean": .., "eval/gold": .., "kl/ref": ..,
                       "policy_ppl": .., "response_length": .., "eval/distinct2": .., ...}],
          "eval": [{"iteration", "proxy", "gold", "kl", "ppl", "length", "distinct2"}],
          "reward_samples": [{"iteration": int, "scores": [float, ...]}],
          "samples": {"start": [{"prompt", "response", "proxy", "gold"}], "end": [...]},
          "warnings": [{"iteration": int, "message": str}],
        }

    - "metrics" are the per-iteration training records (as in metrics.jsonl); `metric_keys` maps the
      names proxy, gold, kl, ppl, length, distinct2 to their keys (defaults above).
    - The curves come from "eval"; a run without "eval" falls back to its "metrics" through `metric_keys`.
      A record's x is its "iteration" (else its "step"); runs of another "x_axis" get a figure of their own.
    - Curves are the mean over seeds with a min-max band; collapse warnings are dashed vertical lines.
    - The final-figures table uses summary["runs"]; without it, each run's last evaluation.
    - A prompt may be a string or a list of chat messages {"role", "content"}. All text is HTML-escaped.
    - None (NaN in jsonl) and missing values are skipped; a missing piece leaves a note in its section.

    Sections (h2, always present, in this order; `SECTIONS`): the verdict first (Findings: the runs,
    the findings with PASS/FAIL, the SFT and reward-model figures; Final figures; Curves), then Gold
    reward against KL, Training monitors, Reward distribution over training, Sample responses, Collapse
    warnings, and the Settings last, folded (<details>). Figures: the curves (also written beside the
    html as `report_overview.png`), the per-iteration training monitors (if any "metrics"), gold
    against KL (if gold and KL were recorded), the reward distribution (if any "reward_samples").
    """
    _validate(summary, runs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = _groups(runs)
    colors = plots.color_map(list(groups))
    markers = {algorithm: _warning_iterations(group) for algorithm, group in groups.items()}
    eval_bands = _bands(groups, lambda run: _eval_series(run, metric_keys))
    sections = {
        "Curves": _curves_section(path.parent, groups, eval_bands, colors, markers),
        "Training monitors": _monitors_section(groups, metric_keys, colors, markers),
        "Gold reward against KL": _frontier_section(groups, eval_bands, metric_keys, colors, summary),
        "Reward distribution over training": _reward_section(groups, colors, reward_buckets),
        "Findings": _overview(summary, runs, notes),
        "Settings": _settings(summary),
        "Final figures": _final_table(_run_entries(summary, runs, metric_keys)),
        "Sample responses": _samples(runs, max_samples),
        "Collapse warnings": _warnings(runs),
    }
    document = page(title, [(name, sections[name]) for name in SECTIONS])
    path.write_text(document, encoding="utf-8")
    return path


def _curves_section(directory: Path, groups, eval_bands, colors, markers) -> str:
    """Evaluation curves, one figure per x axis (iterations first; its PNG is the overview image)."""
    x_axes = {algorithm: _x_axis(group) for algorithm, group in groups.items()}
    curves = []
    for axis in dict.fromkeys(["iteration", *x_axes.values()]):
        bands = {a: b for a, b in eval_bands.items() if x_axes[a] == axis and b}
        if not bands:
            continue
        figure = plots.curves_figure(bands, list(PANEL_TITLES.items()), colors, markers, xlabel=axis)
        png = plots.figure_png(figure)
        if not curves:
            (directory / OVERVIEW_PNG).write_bytes(png)
        label = (
            "" if axis == "iteration" else f"<p><b>Against {_esc(axis)}s:</b> {_esc(', '.join(bands))}</p>"
        )
        curves.append(label + _img(png, f"curves against {axis}"))
    if not curves:
        return _note("No evaluation or training metrics recorded.")
    return _note("Evaluation figures per algorithm: mean over seeds, band = min-max over seeds.") + "".join(
        curves
    )


def _monitors_section(groups, metric_keys, colors, markers) -> str:
    """The per-iteration training monitors, mean over seeds."""

    def monitor_series(run):
        return {name: _points(run.get("metrics") or (), key) for name, key in metric_keys.items()}

    monitor_bands = _bands(groups, monitor_series)
    if not any(monitor_bands.values()):
        return _note("No per-iteration training metrics recorded.")
    recorded = {name for per_panel in monitor_bands.values() for name in per_panel}
    titles = [
        (name, f"{PANEL_TITLES.get(name, name)} [{key}]")
        for name, key in metric_keys.items()
        if name in recorded
    ]
    figure = plots.curves_figure(monitor_bands, titles, colors, markers)
    return _note(
        "Per-iteration training records, mean over seeds: KL rising, perplexity falling and length drifting together "
        "signal pattern collapse (PPO paper §5.2)."
    ) + _img(plots.figure_png(figure), "training monitors")


def _frontier_section(groups, eval_bands, metric_keys, colors, summary) -> str:
    """Gold reward against KL: each algorithm's seed-mean path and its single seeds; the equal-KL table."""
    frontier, seed_points = {}, {}
    for algorithm, group in groups.items():
        band_kl, band_gold = eval_bands[algorithm].get("kl"), eval_bands[algorithm].get("gold")
        if band_kl is None or band_gold is None:
            continue
        common = np.intersect1d(band_kl.x, band_gold.x)
        if common.size == 0:
            continue
        frontier[algorithm] = (
            band_kl.mean[np.isin(band_kl.x, common)],
            band_gold.mean[np.isin(band_gold.x, common)],
        )
        pairs = []
        for run in group:
            series = _eval_series(run, metric_keys)
            gold = dict(series["gold"])
            pairs += [(kl, gold[x]) for x, kl in series["kl"] if x in gold]
        seed_points[algorithm] = (np.asarray([p[0] for p in pairs]), np.asarray([p[1] for p in pairs]))
    if frontier:
        sft_gold = _num((summary.get("sft") or {}).get("gold_mean"))
        figure = plots.frontier_figure(frontier, seed_points, colors, sft_gold)
        text = _note(
            "Each line follows an algorithm's seed-mean (KL, gold) through training; dots are single seeds."
        ) + _img(plots.figure_png(figure), "gold against KL")
    else:
        text = _note("Gold reward and KL were not both recorded.")
    return text + _equal_kl_table(summary.get("equal_kl"))


def _reward_section(groups, colors, reward_buckets: int) -> str:
    """The proxy reward's distribution over training, seeds pooled."""
    buckets = {algorithm: pooled_reward_buckets(group, reward_buckets) for algorithm, group in groups.items()}
    buckets = {algorithm: b for algorithm, b in buckets.items() if b}
    if not buckets:
        return _note("No reward samples recorded.")
    figure = plots.reward_distribution_figure(buckets, colors)
    return _note(
        "Proxy reward of the sampled responses, seeds pooled; a growing one-sided tail is the long-tailed reward of hacking (PPO paper §5.2)."
    ) + _img(plots.figure_png(figure), "reward distribution")


def load_run(
    run_dir: str | os.PathLike,
    algorithm: str,
    seed: int | None = None,
    eval_keys: Mapping[str, str] = DEFAULT_EVAL_KEYS,
) -> dict[str, Any]:
    """A `runs` entry from a run directory's metrics.jsonl: training records become "metrics",
    warning events "warnings", and records carrying any of `eval_keys` an "eval" entry.
    Reward samples and sample responses are not in metrics.jsonl: add them to the dict if kept."""
    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    metrics, warnings, evaluations = [], [], []
    for record in records:
        if record.get("event") == "warning":
            warnings.append(
                {
                    "iteration": record.get("iteration", record.get("step")),
                    "message": record.get("message", ""),
                }
            )
            continue
        if "event" in record:
            continue
        metrics.append(record)
        if any(key in record for key in eval_keys.values()):
            entry = {"iteration": record.get("iteration", record.get("step"))}
            entry.update({name: record.get(key) for name, key in eval_keys.items()})
            evaluations.append(entry)
    return {
        "algorithm": algorithm,
        "seed": seed,
        "metrics": metrics,
        "eval": evaluations,
        "warnings": warnings,
    }
