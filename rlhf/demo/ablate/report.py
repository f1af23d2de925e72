"""The ablation's table (ablation.json) and report: per variant, over seeds, the gold gain at a KL
budget and at the end, the final KL, the collapse detector's verdict, each with its 95% interval,
and the paired difference to the full preset; a forest plot of those differences."""

from __future__ import annotations

from pathlib import Path

from rlhf.demo.ablate.stats import gold_at_kl, mean_ci, verdict
from rlhf.demo.ablate.tricks import Variant
from rlhf.monitor import html_parts as H
from rlhf.monitor import plots

METRICS = {  # key: label
    "gold_gain_at_kl": "gold gain at the KL budget",
    "gold_gain_end": "gold gain at the end",
    "kl_end": "KL at the end",
    "ppl_end": "perplexity at the end",
}


def run_numbers(result: dict, sft_gold: float, kl_budget: float) -> dict:
    """The numbers of one run (its result.json) the ablation compares."""
    trajectory = [(0.0, sft_gold)] + [(t["kl"], t["gold"]) for t in result["trajectory"]]
    at_budget, reached = gold_at_kl(trajectory, kl_budget)
    final = result["final"]
    return {
        "seed": result["seed"],
        "gold_gain_at_kl": at_budget - sft_gold,
        "reached_kl_budget": reached,
        "gold_gain_end": final["gold"] - sft_gold,
        "kl_end": final["kl"],
        "ppl_end": final["ppl"],
        "proxy_end": final["proxy"],
        "length_end": final["length"],
        "collapse": bool(result["collapse_detected"]),
    }


def aggregate(*, preset, variants: list[Variant], skipped, results, sft, kl_budget, world, settings) -> dict:
    sft_gold = sft["gold_mean"]
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(run_numbers(r, sft_gold, kl_budget))
    full = {n["seed"]: n for n in by_variant["full"]}
    rows = []
    for v in variants:
        runs = sorted(by_variant[v.name], key=lambda n: n["seed"])
        row = {
            "variant": v.name,
            "trick": v.trick,
            "source": v.source,
            "switch": v.overrides,
            "preset": v.preset or preset,  # an arm's own (arms.py)
            "runs": runs,
            "collapse": f"{sum(n['collapse'] for n in runs)}/{len(runs)}",
            "reached_kl_budget": f"{sum(n['reached_kl_budget'] for n in runs)}/{len(runs)}",
        }
        for key in METRICS:
            row[key] = mean_ci([n[key] for n in runs])
        if v.name != "full":
            row["vs_full"] = {}
            for key in METRICS:
                paired = [n[key] - full[n["seed"]][key] for n in runs if n["seed"] in full]
                difference = mean_ci(paired)
                difference["verdict"] = verdict(difference)
                row["vs_full"][key] = difference
        rows.append(row)
    return {
        "preset": preset,
        "seeds": len(by_variant["full"]),
        "kl_budget": kl_budget,
        "sft": {"gold_mean": sft_gold, "gold_std": sft.get("gold_std")},
        "world": world,
        "settings": settings,
        "variants": rows,
        "skipped": skipped,
    }


def _interval(stat: dict) -> str:
    if stat["ci95"] is None:
        return f"{stat['mean']:.3f}"
    return f"{stat['mean']:.3f} [{stat['ci95'][0]:.3f}, {stat['ci95'][1]:.3f}]"


def table_rows(ablation: dict) -> list[list[str]]:
    rows = []
    for row in ablation["variants"]:
        diff = row.get("vs_full", {})
        rows.append(
            [
                row["variant"],
                _interval(row["gold_gain_at_kl"]),
                _interval(diff["gold_gain_at_kl"]) if diff else "-",
                _interval(row["gold_gain_end"]),
                _interval(diff["gold_gain_end"]) if diff else "-",
                _interval(row["kl_end"]),
                row["collapse"],
                diff["gold_gain_end"]["verdict"] if diff else "-",
            ]
        )
    return rows


HEADERS = [
    "variant",
    "gold gain @ KL budget",
    "vs full",
    "gold gain (end)",
    "vs full",
    "KL (end)",
    "collapse",
    "end gold vs full",
]


def forest_figure(ablation: dict):
    """Each variant's paired difference to the full preset with its 95% interval, one panel per
    gold measure; the line at 0 is "no effect"."""
    rows = [r for r in ablation["variants"] if r["variant"] != "full"]
    keys = ("gold_gain_at_kl", "gold_gain_end")
    figure = plots._new_figure(10, 0.45 * len(rows) + 1.6)
    for k, key in enumerate(keys):
        ax = figure.add_subplot(1, len(keys), k + 1)
        for y, row in enumerate(rows):
            d = row["vs_full"][key]
            low, high = d["ci95"] if d["ci95"] else (d["mean"], d["mean"])
            color = {"higher": "#2ca02c", "lower": "#d62728"}.get(d["verdict"], "#555555")
            ax.plot([low, high], [y, y], color=color, linewidth=2)
            ax.plot([d["mean"]], [y], "o", color=color)
        ax.axvline(0.0, color="#999999", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["variant"] for r in rows] if k == 0 else [])
        ax.invert_yaxis()
        ax.set_title(f"{METRICS[key]}: variant - full")
        ax.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def write_ablation_report(path: Path, ablation: dict) -> None:
    sft = ablation["sft"]
    intro = H.note(
        f"Preset {ablation['preset']}, {ablation['seeds']} seeds on the built-in world; each variant switches one "
        f"trick of the full preset. Gold gain = held-out gold reward minus the SFT model's ({sft['gold_mean']:.3f}, "
        f"std {sft['gold_std'] or 0:.3f}); at the KL budget = where a run's summed KL first reaches "
        f"{ablation['kl_budget']} (its last value if never). Intervals: 95% t over seeds; 'vs full' is paired by seed. "
        "'no measurable effect' means the interval of the difference holds 0."
    )
    figure = plots.figure_png(forest_figure(ablation)) if len(ablation["variants"]) > 1 else None
    skipped = "".join(H.note(f"{s['trick']}: skipped ({s['reason']})") for s in ablation["skipped"])
    body = intro + H.table(HEADERS, table_rows(ablation)) + skipped
    if figure is not None:
        body += H.img(figure, "forest plot of each trick's effect on gold")
    world = {k: v for k, v in ablation["world"].items() if k.startswith("rm_") or k == "seed"}
    body += H.note(f"world: {world}")
    path.write_text(
        H.page(f"rlhf ablate: {ablation['preset']}", [("Ablation: each trick's effect", H.Html(body))])
    )


def print_ablation(ablation: dict, out_dir: Path) -> None:
    widths = [max(len(h), *(len(r[i]) for r in table_rows(ablation))) for i, h in enumerate(HEADERS)]
    print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)))
    for row in table_rows(ablation):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    for s in ablation["skipped"]:
        print(f"skipped {s['trick']}: {s['reason']}")
    print(f"ablation: {out_dir / 'ablation.json'}   report: {out_dir / 'report.html'}")


def markdown_table(ablation: dict) -> str:
    """The report's table as Markdown (ablation.md), for notes and benchmarks."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(ablation)]
    lines += [f"\nskipped {s['trick']}: {s['reason']}" for s in ablation["skipped"]]
    return "\n".join(lines) + "\n"
