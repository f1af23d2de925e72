"""Does an ablation's verdict hold on other worlds? One table from several `ablation.json` files.

    .venv/bin/python -m bench.studies.ablation_worlds bench/results/ablation_ppo_max_default.json \
        bench/results/ablation_ppo_max_default_world1.json ... [--metric gold_gain_end]

Each file is one `rlhf ablate` run (a world seed, or a world option such as reward drift). Per
trick, the table gives its paired effect on the metric (variant minus the full preset, mean and
95% t interval over the run's seeds) in every file, the effect pooled over every (world, seed) pair,
and whether the per-world verdicts agree: "lower"/"higher" on every world, "no effect on any" when
every interval holds 0, else "differs" (a finding must hold on world seeds other than the
default).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhf.demo.ablate.stats import mean_ci, verdict

METRICS = ("gold_gain_end", "gold_gain_at_kl", "kl_end", "ppl_end")


def label(ablation: dict, path: Path) -> str:
    """The world of a run, as a column title: its seed and any reward distortion it has on."""
    world = ablation.get("world", {})
    parts = [f"world seed {world.get('seed', '?')}"]
    if world.get("rm_scale_drift") or world.get("rm_outlier_rate"):
        parts.append("drift + outliers")
    return ", ".join(parts) or path.stem


def effects(ablation: dict, metric: str) -> dict[str, dict]:
    """variant -> its vs-full difference on `metric` ({"mean", "ci95", "verdict"})."""
    return {row["variant"]: row["vs_full"][metric] for row in ablation["variants"] if "vs_full" in row}


def paired_differences(ablation: dict, variant: str, metric: str) -> list[float]:
    """The variant's per-seed differences to the full preset on `metric` (runs paired by seed)."""
    rows = {row["variant"]: row for row in ablation["variants"]}
    full = {run["seed"]: run[metric] for run in rows["full"]["runs"]}
    return [run[metric] - full[run["seed"]] for run in rows[variant]["runs"] if run["seed"] in full]


def pooled(ablations: list[dict], variant: str, metric: str) -> dict:
    """The effect over every (world, seed) pair at once: more runs, a narrower interval."""
    effect = mean_ci([d for a in ablations for d in paired_differences(a, variant, metric)])
    effect["verdict"] = verdict(effect)
    return effect


def agreement(verdicts: list[str]) -> str:
    if all(v == "no measurable effect" for v in verdicts):
        return "no effect on any"
    if len(set(verdicts)) == 1:
        return f"{verdicts[0]} on every world"
    return "differs"


def cell(effect: dict | None) -> str:
    if effect is None:
        return "-"
    ci = effect.get("ci95")
    interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
    mark = {"lower": " (lower)", "higher": " (higher)"}.get(effect["verdict"], "")
    return f"{effect['mean']:+.2f}{interval}{mark}"


def table(paths: list[Path], metric: str) -> str:
    ablations = [json.loads(p.read_text()) for p in paths]
    columns = [effects(a, metric) for a in ablations]
    variants = [v for v in columns[0] if all(v in c for c in columns)]
    head = ["trick switched", *(label(a, p) for a, p in zip(ablations, paths)), "pooled", "verdicts"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in variants:
        found = [c.get(variant) for c in columns]
        verdicts = [f["verdict"] for f in found if f is not None]
        both = cell(pooled(ablations, variant, metric))
        lines.append(
            "| " + " | ".join([variant, *(cell(f) for f in found), both, agreement(verdicts)]) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ablations", nargs="+", type=Path, help="ablation.json files (one per world)")
    parser.add_argument("--metric", choices=METRICS, default="gold_gain_end")
    args = parser.parse_args(argv)
    print(f"effect on {args.metric} (variant - full preset, paired by seed; 95% t interval)\n")
    print(table(args.ablations, args.metric))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
