"""Two `rlhf demo` runs of one algorithm that differ in a few settings, compared seed by seed.

    .venv/bin/python -m bench.studies.demo_paired BASE_DIR OTHER_DIR [OTHER_DIR ...] --algorithm apa [--json OUT]

Each DIR is a demo's `--out` (its summary.json). Both must share the world, SFT model and reward
model (same world settings; the demo is deterministic on one thread), so that runs of the same
seed differ only in the settings changed. Per run directory it gives the final figures on
held-out prompts (gold gain over SFT in SFT standard deviations, gold peak, proxy, KL, perplexity,
distinct-2, collapse detector) as a mean and 95% t interval over seeds, and for each OTHER the
difference to BASE paired by seed. Used for APA/AWR with the APA paper's values against the
demo's, and for the collapse runs of bench/studies/ablation.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhf.demo.ablate.stats import mean_ci, verdict

FIGURES = ("gold_gain", "peak_gain", "proxy", "kl", "ppl", "distinct2")


def run_figures(directory: Path, algorithm: str) -> dict[int, dict]:
    """seed -> the final figures of `algorithm`'s run, gold in SFT standard deviations above SFT."""
    summary = json.loads((directory / "summary.json").read_text())
    sft = summary["sft"]
    figures = {}
    for run in summary["runs"]:
        if run["algorithm"] != algorithm:
            continue
        final = run["final"]
        figures[run["seed"]] = {
            "gold_gain": (final["gold"] - sft["gold_mean"]) / sft["gold_std"],
            "peak_gain": (run["peak_gold"] - sft["gold_mean"]) / sft["gold_std"],
            "proxy": final["proxy"],
            "kl": final["kl"],
            "ppl": final["ppl"],
            "distinct2": final["distinct2"],
            "collapse": bool(run["collapse_detected"]),
        }
    if not figures:
        raise SystemExit(f"{directory}/summary.json has no run of {algorithm!r}")
    return figures


def compare(base: Path, others: list[Path], algorithm: str) -> dict:
    """Figures per run directory and differences to `base`, keyed by the directories' names."""
    runs = {d.name: run_figures(d, algorithm) for d in [base, *others]}
    if len(runs) != 1 + len(others):
        raise SystemExit("the run directories must have different names (they label the table)")
    out = {"algorithm": algorithm, "base": base.name, "runs": {}, "vs_base": {}}
    for name, by_seed in runs.items():
        seeds = sorted(by_seed)
        out["runs"][name] = {k: mean_ci([by_seed[s][k] for s in seeds]) for k in FIGURES}
        out["runs"][name]["collapse"] = f"{sum(by_seed[s]['collapse'] for s in seeds)}/{len(seeds)}"
    for name in (d.name for d in others):
        shared = sorted(set(runs[name]) & set(runs[base.name]))
        out["vs_base"][name] = {}
        for key in FIGURES:
            difference = mean_ci([runs[name][s][key] - runs[base.name][s][key] for s in shared])
            difference["verdict"] = verdict(difference)
            out["vs_base"][name][key] = difference
    return out


def interval(stat: dict) -> str:
    ci = stat.get("ci95")
    return f"{stat['mean']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def markdown(result: dict) -> str:
    head = [
        "run",
        "gold gain (SFT std)",
        "vs base",
        "gold peak",
        "KL",
        "vs base",
        "ppl",
        "distinct-2",
        "collapse",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, figures in result["runs"].items():
        diff = result["vs_base"].get(name)
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    interval(figures["gold_gain"]),
                    interval(diff["gold_gain"]) if diff else "-",
                    interval(figures["peak_gain"]),
                    interval(figures["kl"]),
                    interval(diff["kl"]) if diff else "-",
                    interval(figures["ppl"]),
                    interval(figures["distinct2"]),
                    figures["collapse"],
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the demo directory compared against")
    parser.add_argument("others", nargs="+", type=Path, help="demo directories with changed settings")
    parser.add_argument("--algorithm", required=True, help="the algorithm whose runs are paired")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    result = compare(args.base, args.others, args.algorithm)
    print(f"{args.algorithm}: final figures, mean [95% t interval] over seeds; 'vs base' paired by seed\n")
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
