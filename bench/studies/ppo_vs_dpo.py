"""PPO-max against DPO on the built-in world, over seeds and two world seeds.

    nice -n 10 env PYTHONPATH=. .venv/bin/python -m bench.studies.ppo_vs_dpo
        [--worlds 0,1] [--seeds 3] [--root runs/ppo_vs_dpo] [--json bench/results/ppo_vs_dpo.json]
        [-- DEMO OVERRIDES ...]

Per world seed W it runs, one after the other,

    rlhf demo --compare-only ppo_max,dpo --seeds 3 --world.seed W --out ROOT/worldW [OVERRIDES]

(the demo's own settings: one SFT model and proxy reward model per world, PPO-max and DPO from
them with seeds 0-2, both evaluated on the same held-out prompts), skipping a world whose
summary.json already holds both algorithms for every seed under the same command (resume: run it
again). Then, from each world's summary.json and runs.json, per run: the final held-out gold,
proxy reward, KL to the SFT model, and the gold gain over the SFT model at the end and where the
run's KL first reaches the demo's `kl_budget` (interpolated, exactly as the demo's `equal_kl` and
`rlhf ablate` read it: rlhf/demo/ablate/report.py run_numbers); per algorithm the mean and 95% t
interval over seeds (per world and pooled over every (world, seed)), and the difference PPO-max
minus DPO paired by (world, seed) with its 95% t interval (rlhf/demo/ablate/stats.py mean_ci,
verdict). Writes every per-seed figure and the aggregates to --json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rlhf.demo.ablate.report import run_numbers
from rlhf.demo.ablate.stats import mean_ci, verdict

ALGORITHMS = ("ppo_max", "dpo")
METRICS = ("gold_gain_end", "gold_gain_at_kl", "kl_end", "proxy_end")
NAMES = {"ppo_max": "PPO-max", "dpo": "DPO", "online_dpo": "online DPO"}


def demo_command(world: int, seeds: int, out: Path, overrides: list[str]) -> list[str]:
    return [
        *("rlhf", "demo", "--compare-only", ",".join(ALGORITHMS), "--seeds", str(seeds)),
        *("--world.seed", str(world), "--out", str(out), *overrides),
    ]


def finished(out: Path, command: list[str], seeds: int) -> bool:
    """Whether `out` holds a finished demo of this very command (both algorithms, every seed)."""
    summary_path, marker = out / "summary.json", out / "ppo_vs_dpo_command.json"
    if not (summary_path.is_file() and (out / "runs.json").is_file() and marker.is_file()):
        return False
    if json.loads(marker.read_text()) != command:
        return False
    runs = {(r["algorithm"], r["seed"]) for r in json.loads(summary_path.read_text())["runs"]}
    return runs == {(a, s) for a in ALGORITHMS for s in range(seeds)}


def world_figures(out: Path, world: int, algorithms: tuple[str, ...] = ALGORITHMS) -> tuple[dict, list[dict]]:
    """(the world's SFT and reward-model figures, one row per run) from a finished demo of `algorithms`."""
    summary = json.loads((out / "summary.json").read_text())
    runs = json.loads((out / "runs.json").read_text())
    sft = summary["sft"]
    budget = summary["equal_kl"]["kl_budget"]
    rows = []
    for entry, run in zip(summary["runs"], runs):
        assert (entry["algorithm"], entry["seed"]) == (run["algorithm"], run["seed"])
        # as the demo's equal_kl() feeds run_numbers (rlhf/demo/run.py)
        trajectory = [{"kl": h["kl"], "gold": h["gold"]} for h in run["eval"]]
        result = {**entry, "collapse_detected": bool(entry["collapse_detected"]), "trajectory": trajectory}
        numbers = run_numbers(result, sft["gold_mean"], budget)
        rows.append(
            {
                "world": world,
                "algorithm": entry["algorithm"],
                "seed": entry["seed"],
                "final": entry["final"],
                "peak_gold": entry["peak_gold"],
                "gold_gain_end": numbers["gold_gain_end"],
                "gold_gain_at_kl": numbers["gold_gain_at_kl"],
                "reached_kl_budget": numbers["reached_kl_budget"],
                "kl_end": numbers["kl_end"],
                "proxy_end": numbers["proxy_end"],
                "gold_gain_end_sft_std": numbers["gold_gain_end"] / sft["gold_std"],
                "collapse_detected": entry["collapse_detected"],
                "seconds": entry["seconds"],
            }
        )
    # the demo's own table must read the same means (nothing recomputed differently here)
    for algorithm in algorithms:
        for key in ("gold_gain_at_kl", "gold_gain_end", "kl_end"):
            ours = mean_ci([r[key] for r in rows if r["algorithm"] == algorithm])["mean"]
            theirs = summary["equal_kl"]["algorithms"][algorithm][key]["mean"]
            assert abs(ours - theirs) < 1e-9, (world, algorithm, key, ours, theirs)
    figures = {
        "world_seed": world,
        "kl_budget": budget,
        "sft": {k: sft[k] for k in ("gold_mean", "gold_std", "proxy_mean")},
        "reward_model": summary["reward_model"],
        "demo_seconds": summary["seconds"],
    }
    return figures, rows


def aggregate(
    rows: list[dict],
    algorithms: tuple[str, ...] = ALGORITHMS,
    pairs: tuple[tuple[str, str], ...] = (("ppo_max", "dpo"),),
) -> dict:
    """Per algorithm mean [95% t] over the rows, and for each (a, b) of `pairs` a minus b paired by
    (world, seed) under "a_minus_b"."""
    table: dict = {}
    for algorithm in algorithms:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        table[algorithm] = {key: mean_ci([r[key] for r in mine]) for key in METRICS}
        table[algorithm]["reached_kl_budget"] = f"{sum(r['reached_kl_budget'] for r in mine)}/{len(mine)}"
    by = {(r["world"], r["seed"], r["algorithm"]): r for r in rows}
    for a, b in pairs:
        both = sorted({(w, s) for w, s, _ in by if (w, s, a) in by and (w, s, b) in by})
        if not both:  # a partial study: no seed ran both
            continue
        difference = {}
        for key in METRICS:
            diff = mean_ci([by[(w, s, a)][key] - by[(w, s, b)][key] for w, s in both])
            name = NAMES.get(a, a)
            diff["verdict"] = {"higher": f"{name} higher", "lower": f"{name} lower"}.get(
                verdict(diff), "no measurable difference"
            )
            difference[key] = diff
        table[f"{a}_minus_{b}"] = difference
    return table


def _fmt(stat: dict) -> str:
    ci = stat["ci95"]
    return f"{stat['mean']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="0,1", help="world seeds, comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per algorithm per world")
    parser.add_argument("--root", default="runs/ppo_vs_dpo", help="one demo --out per world under it")
    parser.add_argument("--json", default="bench/results/ppo_vs_dpo.json")
    parser.add_argument("overrides", nargs="*", help="demo overrides after --, applied to every world")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    started = time.perf_counter()
    per_world, rows, commands = [], [], []
    for world in worlds:
        out = Path(args.root) / f"world{world}"
        command = demo_command(world, args.seeds, out, args.overrides)
        commands.append(" ".join(command))
        if finished(out, command, args.seeds):
            print(f"world seed {world}: finished earlier ({out}), skipped", flush=True)
        else:
            print(f"world seed {world}: {' '.join(command)}", flush=True)
            (out / "ppo_vs_dpo_command.json").unlink(missing_ok=True)
            subprocess.run([sys.executable, "-m", "rlhf", *command[1:]], check=True)
            (out / "ppo_vs_dpo_command.json").write_text(json.dumps(command))
        figures, world_rows = world_figures(out, world)
        figures["aggregate"] = aggregate(world_rows)
        per_world.append(figures)
        rows += world_rows
    pooled = aggregate(rows)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "nice -n 10 env PYTHONPATH=. .venv/bin/python -m bench.studies.ppo_vs_dpo"
        + (f" --worlds {args.worlds}" if args.worlds != "0,1" else "")
        + (f" --seeds {args.seeds}" if args.seeds != 3 else "")
        + (f" -- {' '.join(args.overrides)}" if args.overrides else ""),
        "demo_commands": commands,
        "settings": "the demo's defaults (100 RL iterations, 300 DPO steps, kl_budget 2)"
        if not args.overrides
        else f"the demo's defaults with {' '.join(args.overrides)}, every run alike",
        "units": "gold gain = held-out gold reward minus the world's SFT model's (gold units); "
        "gold_gain_at_kl where the run's KL to SFT first reaches kl_budget (its last value if never); "
        "intervals: 95% t over seeds (pooled: over every (world, seed)), differences paired",
        "runs": rows,
        "worlds": per_world,
        "pooled": pooled,
        "bench_seconds": time.perf_counter() - started,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for label, table in [
        *((f"world {w['world_seed']}", w["aggregate"]) for w in per_world),
        ("pooled", pooled),
    ]:
        print(f"{label}:")
        for algorithm in ALGORITHMS:
            row = table[algorithm]
            print(
                f"  {algorithm:8s} gain end {_fmt(row['gold_gain_end'])}  gain @KL {_fmt(row['gold_gain_at_kl'])}"
                f" ({row['reached_kl_budget']})  KL end {_fmt(row['kl_end'])}"
            )
        d = table["ppo_max_minus_dpo"]
        print(
            f"  PPO-max - DPO: end {_fmt(d['gold_gain_end'])} ({d['gold_gain_end']['verdict']}),"
            f" @KL {_fmt(d['gold_gain_at_kl'])} ({d['gold_gain_at_kl']['verdict']})"
        )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
