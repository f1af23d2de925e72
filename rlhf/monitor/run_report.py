"""`report.html` of one training run (`rlhf sft`, `rlhf rm` or `rlhf train`), from its directory alone.

    write_run_report("runs/ppo")   # -> runs/ppo/report.html; NotARunDirectory for anything else

Sections (`SECTIONS`): Summary (what ran, headline metrics, configuration highlights folded);
Monitors (a figure per group of run_kinds.py, collapse warnings dashed, the reward distribution or
held-out margins); Warnings; Samples (`samples.jsonl`, `eval.json`). Self-contained: embedded PNGs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.monitor import plots
from rlhf.monitor.html_parts import NumText, esc, fmt, img, note, num, page, pooled_reward_buckets, table
from rlhf.monitor.run_files import KINDS, RunFiles, read_run_dir
from rlhf.monitor.run_kinds import (
    NOT_PLOTTED,
    SPECS,
    config_value,
    group_of,
    group_title,
    ordered_groups,
    panel_of,
)

SECTIONS = ("Summary", "Monitors", "Warnings", "Samples")
REPORT_FILE = "report.html"
COLLAPSE_MARK = "pattern collapse"  # how the collapse detector's warnings begin
MAX_SAMPLES = 5  # rows shown per evaluation
COLUMNS = 4  # panels per row of a monitor figure


def write_run_report(directory: str | os.PathLike, run: RunFiles | None = None) -> Path:
    """Write `directory/report.html` (through a temporary file) and return its path."""
    run = run if run is not None else read_run_dir(directory)
    title = f"rlhf {SPECS[run.kind].title} run: {run.directory.resolve().name}"
    document = page(
        title,
        [
            ("Summary", _summary(run)),
            ("Monitors", _monitors(run)),
            ("Warnings", _warnings(run)),
            ("Samples", _samples(run)),
        ],
    )
    path = run.directory / REPORT_FILE
    tmp = path.with_name(f".{REPORT_FILE}.tmp")
    tmp.write_text(document, encoding="utf-8")
    os.replace(tmp, path)
    return path


# -- series -----------------------------------------------------------------------------------------


def _series(records: Sequence[Mapping[str, Any]], x_key: str) -> dict[str, list[tuple[float, float]]]:
    """Per numeric metric key: (x, value) of every record holding a finite number under it."""
    series: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        x = num(record.get(x_key))
        if x is None:
            continue
        for key, value in record.items():
            y = num(value)
            if key == x_key or key in NOT_PLOTTED or y is None:
                continue
            series.setdefault(key, []).append((x, y))
    return series


def _collapse_steps(run: RunFiles) -> list[float]:
    return sorted(
        {
            float(w["step"])
            for w in run.warnings
            if w["message"].startswith(COLLAPSE_MARK) and num(w["step"]) is not None
        }
    )


# -- summary ----------------------------------------------------------------------------------------


def _summary(run: RunFiles) -> str:
    spec = SPECS[run.kind]
    steps = [int(r[run.step_key]) for r in run.records]
    planned = next(
        (v for v in (_config_or_none(run.config, k) for k in spec.length_keys) if v is not None), None
    )
    collapse = _collapse_steps(run)
    facts: list[tuple[str, Any]] = [
        ("kind", f"{KINDS[run.kind]} (rlhf {dict(sft='sft', rm='rm', dpo='dpo', rl='train')[run.kind]})"),
        ("directory", str(run.directory)),
        (f"{run.step_key}s logged", NumText(f"{min(steps)} – {max(steps)} ({len(steps)} records)")),
    ]
    if planned is not None:
        done = max(steps) + 1  # records count from 0
        facts.append(
            (
                f"planned {run.step_key}s",
                NumText(f"{planned} ({'reached' if done >= planned else f'stopped at {done}'})"),
            )
        )
    if run.pretrain:
        facts.append(("critic pre-training iterations", len(run.pretrain)))
    facts.append(("warnings", len(run.warnings)))
    if run.kind == "rl":
        facts.append(
            (
                "collapse detector",
                f"fired at iteration {', '.join(fmt(s) for s in collapse)}" if collapse else "did not fire",
            )
        )
    facts.append(("model exported", "yes" if (run.directory / "config.json").is_file() else "no"))
    shown = [(key, _config_or_none(run.config, key)) for key in spec.config_keys]
    shown = [(key, value) for key, value in shown if value is not None]
    config = (
        table(("configuration", "value"), shown)
        if shown
        else note("No config.yaml in the directory: no configuration to show.")
    )
    return (  # what ran and its figures first; the settings folded below them
        table(("run", ""), facts)
        + "<h3>Headline metrics</h3>"
        + _headline(run)
        + f"<details><summary>Configuration ({len(shown)} settings)</summary>{config}</details>"
    )


def _headline(run: RunFiles) -> str:
    series = _series(run.records, run.step_key)
    keys = list(SPECS[run.kind].headline)
    keys += [(key, None) for key in sorted(series) if key.startswith("eval/") and key not in dict(keys)]
    rows = []
    for key, direction in keys:
        points = series.get(key)
        if not points:
            continue
        best, at = "-", "-"
        if direction is not None:
            pick = min if direction == "min" else max
            at_x, best_y = pick(points, key=lambda p: p[1])
            best, at = best_y, int(at_x)
        rows.append((key, points[0][1], points[-1][1], best, at, int(points[-1][0])))
    if not rows:
        return note("None of the headline metrics was recorded.")
    headers = ("metric", "first", "final", "best", f"best at {run.step_key}", f"final at {run.step_key}")
    return table(headers, rows)


def _config_or_none(config: dict, key: str):
    try:
        return config_value(config, key)
    except KeyError:
        return None


# -- monitors ---------------------------------------------------------------------------------------


def _monitors(run: RunFiles) -> str:
    series = _series(run.records, run.step_key)
    if run.pretrain:
        series.update(_series(run.pretrain, "pretrain"))
    groups: dict[str, list[str]] = {}
    for key in sorted(series):
        groups.setdefault(group_of(key), []).append(key)
    markers = _collapse_steps(run)
    parts = [note("Dashed vertical lines: iterations where the collapse detector warned.")] if markers else []
    for group in ordered_groups(groups):
        panels, flat, copies = _panels(series, groups[group], preferred=dict(SPECS[run.kind].headline))
        parts.append(f"<h3>{esc(group_title(group))}</h3>")
        if panels:
            pretraining = group == "critic_pretrain"
            figure = plots.monitor_figure(
                panels,
                () if pretraining else markers,
                xlabel="pre-training iteration" if pretraining else run.step_key,
                columns=COLUMNS,
            )
            parts.append(img(plots.figure_png(figure), group))
        if flat:
            parts.append(note("Constant over the run: " + ", ".join(flat) + "."))
        if copies:
            parts.append(note("Not drawn twice: " + ", ".join(copies) + "."))
    parts.append(_distribution(run))
    return "".join(parts) if series else note("No numeric metrics were recorded.")


def _panels(series: dict[str, list[tuple[float, float]]], keys: Sequence[str], preferred=()):
    """The panels of a group's keys, and the keys left out: constant ones (with their value) and
    exact copies of another key (`kl/k1` is `kl/ref` with the k1 estimator; `preferred` keys are
    kept under their own name)."""
    panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    flat, copies, seen = [], [], {}
    for key in sorted(keys, key=lambda k: (k not in preferred, k)):
        points = series[key]
        values = [y for _, y in points]
        if len(points) > 1 and max(values) == min(values):
            flat.append(f"{key} = {fmt(values[0])}")
            continue
        if tuple(points) in seen:
            copies.append(f"{key} (same as {seen[tuple(points)]})")
            continue
        seen[tuple(points)] = key
        title, label = panel_of(key)
        xs, ys = zip(*points)
        panels.setdefault(title, {})[label] = (np.asarray(xs), np.asarray(ys))
    return sorted(panels.items()), flat, copies


def _distribution(run: RunFiles) -> str:
    """The reward of the sampled responses over training (RL), the held-out margins (reward model)."""
    key, title, caption = {
        "rl": (
            "reward/raw_scores",
            "Reward distribution over training",
            "Reward-model scores of the sampled responses per iteration bucket; a growing one-sided tail "
            "is the long-tailed reward of hacking (PPO paper §5.2).",
        ),
        "rm": (
            "eval/margins",
            "Held-out margins over training",
            "Score of the chosen minus the rejected response on each held-out pair, per evaluation; "
            "a pair below zero is ranked wrong.",
        ),
    }.get(run.kind, (None, "", ""))
    if key is None:
        return ""
    samples = [
        {"iteration": r[run.step_key], "scores": r[key]} for r in run.records if isinstance(r.get(key), list)
    ]
    buckets = pooled_reward_buckets([{"reward_samples": samples}], 6)
    if not buckets:
        return ""
    label = run.directory.resolve().name or "run"
    figure = plots.reward_distribution_figure({label: buckets}, plots.color_map([label]))
    return f"<h3>{esc(title)}</h3>" + note(caption) + img(plots.figure_png(figure), title)


# -- warnings and samples ---------------------------------------------------------------------------


def _warnings(run: RunFiles) -> str:
    if not run.warnings:
        detector = " (the collapse detector never fired)" if run.kind == "rl" else ""
        return note(f"The run logged no warning{detector}.")
    rows = [
        (
            w["step"],
            "collapse" if w["message"].startswith(COLLAPSE_MARK) else "note",
            w["message"],
        )
        for w in run.warnings
    ]
    rows.sort(key=lambda row: row[1] != "collapse")  # collapse first, each kind in logged order
    return table((run.step_key, "kind", "warning"), rows, text_columns=(2,))


TEXT_KEYS = ("prompt", "response", "policy_response", "baseline_response", "chosen", "rejected")


def _sample_table(rows: Sequence[Any]) -> str:
    """A table of sample rows (dicts, or bare response strings); text columns first, then the rest."""
    rows = [row if isinstance(row, Mapping) else {"response": row} for row in rows]
    keys = list(dict.fromkeys(key for row in rows for key in row))
    text = [k for k in TEXT_KEYS if k in keys] + [
        k for k in keys if k not in TEXT_KEYS and any(isinstance(row.get(k), (str, list)) for row in rows)
    ]
    rest = [k for k in keys if k not in text]
    columns = rest[:1] + text + rest[1:] if rest[:1] in (["iteration"], ["step"]) else text + rest
    cells = [[_cell(row.get(k)) for k in columns] for row in rows]
    return table(columns, cells, text_columns=[i for i, k in enumerate(columns) if k in text])


def _cell(value: Any) -> Any:
    if isinstance(value, list):  # a chat prompt: one line per message
        return "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, Mapping) else str(m)
            for m in value
        )
    return "" if value is None else value


def _samples(run: RunFiles) -> str:
    parts = []
    if run.samples:
        by_step: dict[Any, list[dict]] = {}
        for row in run.samples:
            by_step.setdefault(row.get(run.step_key, row.get("step")), []).append(row)
        steps = list(by_step)
        chosen = steps[:1] + steps[-1:] if len(steps) > 1 else steps
        for step in chosen:
            parts.append(f"<h3>{esc(run.step_key)} {esc(fmt(step))}</h3>")
            parts.append(_sample_table(by_step[step][:MAX_SAMPLES]))
    if run.evaluation is not None:
        parts.append("<h3>rlhf eval (eval.json)</h3>" + _evaluation(run.evaluation))
    if parts:
        return "".join(parts)
    where = {
        "rl": "the directory holds no samples.jsonl and no eval.json (`rlhf eval --policy DIR` writes "
        "one beside the policy)",
        "sft": "an SFT run records losses only",
        "rm": "a reward-model run records scores and margins only",
        "dpo": "a DPO run records losses, implicit rewards and log-probs only",
    }[run.kind]
    return note(f"No sample responses: {where}.")


def _rate_text(entry: Any) -> str:
    if not isinstance(entry, Mapping) or num(entry.get("win_rate")) is None:
        return "-"
    interval = entry.get("win_rate_ci95")
    ci = (
        f" [{fmt(interval[0], 3)}, {fmt(interval[1], 3)}]"
        if isinstance(interval, list) and len(interval) == 2
        else ""
    )
    return f"{fmt(entry['win_rate'], 3)}{ci}"


def _length_paragraph(length: Mapping[str, Any]) -> str:
    """eval.json's length figures (docs/algorithms.md §33): the length-controlled and length-matched
    win rates, and the warning when the judge's preference follows length."""
    matched = length.get("length_matched") if isinstance(length.get("length_matched"), Mapping) else {}
    text = (
        f"<p><b>length-controlled win rate</b> (at equal lengths, bootstrap 95%): "
        f"{esc(_rate_text(length.get('length_controlled')))}; <b>length-matched</b> (|length difference| "
        f"&lt;= {esc(fmt(matched.get('tolerance')))} {esc(length.get('unit', 'words'))}, "
        f"n={esc(fmt(matched.get('n')))}): {esc(_rate_text(matched))}</p>"
    )
    if length.get("warning"):
        text += f"<p><b>warning:</b> {esc(length['warning'])}</p>"
    return text


def _other_judge(name: str, figures: Any) -> str:
    """A further judge's win rate and length figures (eval.json's `judges`)."""
    if not isinstance(figures, Mapping):
        return ""
    comparison = figures.get("comparison") if isinstance(figures.get("comparison"), Mapping) else {}
    text = (
        f"<p><b>judge {esc(name)}</b>: win rate of the policy (ties half) "
        f"{esc(_rate_text({'win_rate': comparison.get('win_rate'), 'win_rate_ci95': comparison.get('win_rate_ci95')}))}</p>"
    )
    length = figures.get("length")
    return text + (_length_paragraph(length) if isinstance(length, Mapping) else "")


def _llm_judge_paragraph(llm: Mapping[str, Any]) -> str:
    """eval.json's `llm_judge` (docs/algorithms.md §33): the position-swapped pairwise win rate."""
    counts = " / ".join(esc(fmt(llm.get(k))) for k in ("wins", "ties", "losses"))
    return (
        f"<p><b>LLM judge</b> {esc(llm.get('model', '?'))}: win rate of the policy (ties and verdicts "
        f"contradicted on swapping half) {esc(_rate_text(llm))} over {esc(fmt(llm.get('n')))} pairs, each "
        f"judged in both orders; wins / ties / losses {counts}; {esc(fmt(llm.get('inconsistent')))} "
        f"contradicted; {esc(fmt(llm.get('unparsable')))} unparsable replies</p>"
    )


def _label_pairs_paragraph(pairs: Mapping[str, Any]) -> str:
    """eval.json's `pairs` (docs/algorithms.md §38): the verdict of held-out human labels."""

    def three(value: Any) -> str:
        return "-" if num(value) is None else f"{value:.3f}"

    ci = (
        pairs.get("ci95") if isinstance(pairs.get("ci95"), list) and len(pairs["ci95"]) == 2 else [None, None]
    )
    margin = num(pairs.get("margin_mean"))
    return (
        f"<p><b>held-out human labels</b>: the policy raised the chosen response's log-ratio to the "
        f"baseline above the rejected one's on {three(pairs['accuracy'])} [{three(ci[0])}, {three(ci[1])}] "
        f"of {esc(fmt(pairs.get('n')))} pairs (ties half); mean margin "
        f"{'-' if margin is None else f'{margin:+.4f}'} nats</p>"
    )


def _interval_text(figures: Any, signed: bool = False) -> str:
    """`0.420 [0.293, 0.558]` of an entry's mean and ci95 ("-" when it has none)."""
    if not isinstance(figures, Mapping) or num(figures.get("mean")) is None:
        return "-"
    spec = "+.3f" if signed else ".3f"
    ci = figures.get("ci95")
    bounds = isinstance(ci, list) and len(ci) == 2 and all(num(c) is not None for c in ci)
    return f"{figures['mean']:{spec}}" + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if bounds else "")


def _reward_functions_table(functions: Mapping[str, Any]) -> str:
    """eval.json's `reward_functions` (docs/algorithms.md §40): each function's mean on the policy's
    answers with its 95% interval (an accuracy with Wilson's for a 0/1 verifier) and, against a
    baseline, the paired difference with its t interval and the wins / ties / losses."""
    paired = any(isinstance(f, Mapping) and "difference" in f for f in functions.values())
    rows = []
    for name, figures in functions.items():
        if not isinstance(figures, Mapping):
            continue
        row = [
            str(name),
            NumText(_interval_text(figures)),
            str(figures.get("interval", "?")),
            figures.get("n"),
        ]
        if paired:
            diff = figures.get("difference") if isinstance(figures.get("difference"), Mapping) else {}
            counts = " / ".join(fmt(diff.get(k)) for k in ("wins", "ties", "losses"))
            row += [
                NumText(_interval_text(figures.get("baseline"))),
                NumText(_interval_text(diff, True)),
                counts,
            ]
        rows.append(row)
    headers = ["reward function", "policy mean [95%]", "interval", "n"]
    headers += (
        ["baseline mean [95%]", "policy - baseline [95%, paired t]", "wins / ties / losses"] if paired else []
    )
    return (
        "<p><b>reward functions</b> on the policy's answers (the mean of a 0/1 verifier is its accuracy):</p>"
        + table(headers, rows, text_columns=[0])
    )


def _evaluation(evaluation: Mapping[str, Any]) -> str:
    rows = []
    for side in ("policy", "baseline"):
        entry = evaluation.get(side)
        if isinstance(entry, Mapping) and "mean" in entry:
            rows.append((side, str(entry.get("path", "")), entry.get("mean"), entry.get("n")))
    parts = []
    functions = evaluation.get("reward_functions")
    if isinstance(functions, Mapping) and functions:  # the findings first
        parts.append(_reward_functions_table(functions))
    if rows:
        parts.append(table(("side", "path", "mean score", "n"), rows))
    comparison = evaluation.get("comparison")
    if isinstance(comparison, Mapping) and num(comparison.get("win_rate")) is not None:
        parts.append(
            f"<p><b>win rate of the policy</b> (ties half): {esc(fmt(comparison['win_rate'], 3))}"
            f" over {esc(fmt(comparison.get('n')))} prompts; judge {esc(evaluation.get('judge', '?'))}</p>"
        )
    length = evaluation.get("length")
    if isinstance(length, Mapping):
        parts.append(_length_paragraph(length))
    llm = evaluation.get("llm_judge")
    if isinstance(llm, Mapping):
        parts.append(_llm_judge_paragraph(llm))
    pairs = evaluation.get("pairs")
    if isinstance(pairs, Mapping) and num(pairs.get("accuracy")) is not None:
        parts.append(_label_pairs_paragraph(pairs))
    judges = evaluation.get("judges")
    for name, figures in list(judges.items())[1:] if isinstance(judges, Mapping) else []:
        parts.append(_other_judge(name, figures))  # `--judge A --judge B`: the same answers, judge B
    samples = evaluation.get("samples")
    if not isinstance(samples, list):
        policy = evaluation.get("policy")
        samples = policy.get("samples") if isinstance(policy, Mapping) else None
    if isinstance(samples, list) and samples:
        parts.append(_sample_table(samples[:MAX_SAMPLES]))
    return "".join(parts) if parts else note("eval.json holds neither scores nor samples.")
