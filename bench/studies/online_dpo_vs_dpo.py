"""Online DPO against offline DPO and PPO-max on the built-in world, over seeds.

    nice -n 15 env PYTHONPATH=. .venv/bin/python -m bench.studies.online_dpo_vs_dpo
        [--world 0] [--seeds 3] [--root runs/online_dpo_vs_dpo] [--json bench/results/online_dpo_vs_dpo.json]

Runs, side by side (two processes; each builds the world's same SFT model and proxy reward model,
which the script checks by their figures),

    rlhf demo --compare-only ppo_max --seeds S --world.seed W --out ROOT/worldW_ppo_max
    rlhf demo --compare-only online_dpo,dpo --seeds S --world.seed W --out ROOT/worldW_dpo

(the demo's settings: PPO-max, online DPO and DPO from one SFT start with seeds 0..S-1, evaluated on
the same held-out prompts with the world's gold reward; online DPO samples the same 64 responses per
iteration as PPO-max, as 32 pairs), skipping a demo that finished earlier under the same command.
Then, as bench/studies/ppo_vs_dpo.py reads them: per run the final gold gain over the SFT model,
the gain where the run's KL first reaches the demo's kl_budget, the final KL and proxy reward; per
algorithm the mean and 95% t interval over seeds; online DPO minus DPO and minus PPO-max paired by
seed. Writes every figure to --json.

With --partial it starts nothing and reads every demo under ROOT/worldW_* as it stands: a finished
one from its summary, an unfinished one's finished RL runs from their metrics.jsonl (the held-out
evaluations every 5 iterations, the last at iteration 95: the demo's extra evaluation at the end
is not logged there) against the SFT baseline evaluated here as the demo evaluates it; an
unfinished demo's DPO runs keep their evaluations in memory and are left out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.studies.ppo_vs_dpo import _fmt, aggregate, world_figures

SPLIT = {"ppo_max": ("ppo_max",), "dpo": ("online_dpo", "dpo")}  # demo out suffix -> its runs
ALGORITHMS = ("ppo_max", "dpo", "online_dpo")
PAIRS = (("online_dpo", "dpo"), ("online_dpo", "ppo_max"))


def demo_command(world: int, seeds: int, out: Path, runs: tuple[str, ...]) -> list[str]:
    return ["rlhf", "demo", "--compare-only", ",".join(runs), "--seeds", str(seeds),
            "--world.seed", str(world), "--out", str(out)]  # fmt: skip


def finished(out: Path, command: list[str]) -> bool:
    marker = out / "study_command.json"
    done = (out / "summary.json").is_file() and (out / "runs.json").is_file() and marker.is_file()
    return done and json.loads(marker.read_text()) == command


def partial_figures(out: Path, world: int, sft: dict | None = None) -> tuple[dict, list[dict]]:
    """(the SFT and reward-model figures, one row per finished RL run) of a demo still running;
    `sft`: the SFT baseline of a finished demo of the same world (else evaluated here)."""
    from rlhf.demo.ablate.report import run_numbers
    from rlhf.demo.run import DemoConfig, _sft_baseline, eval_prompts
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.worlds import WorldConfig, build_world

    cfg = DemoConfig(world=WorldConfig(seed=world))
    if sft is None:
        built = build_world(cfg.world)
        reward_model = ScalarHeadModel.from_pretrained(out / "rm").eval()
        texts, ids = eval_prompts(cfg, out / "world", built.tokenizer)
        sft = _sft_baseline(built, reward_model, out, texts, ids)
    rows = []
    for run_dir in sorted((out / "runs").glob("*-seed*")):
        algorithm, seed = run_dir.name.rsplit("-seed", 1)
        if not (run_dir / "config.json").is_file():  # not exported yet: unfinished
            continue
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in records if "eval/gold" in r and "event" not in r]
        if not evals:  # a DPO run: its evaluations are kept in the demo's memory only
            continue
        trajectory = [{"kl": r["eval/kl"], "gold": r["eval/gold"]} for r in evals]
        last = evals[-1]
        final = {k: last[f"eval/{k}"] for k in ("proxy", "gold", "kl", "ppl", "length", "distinct2")}
        result = {"seed": int(seed), "final": final, "trajectory": trajectory, "collapse_detected": False}
        numbers = run_numbers(result, sft["gold_mean"], cfg.kl_budget)
        rows.append({"world": world, "algorithm": algorithm, "seed": int(seed), "final": final,
                     "evaluated_at_iteration": last["iteration"], **{k: numbers[k] for k in (
                         "gold_gain_end", "gold_gain_at_kl", "reached_kl_budget", "kl_end", "proxy_end")}})  # fmt: skip
    figures = {"world_seed": world, "kl_budget": cfg.kl_budget, "sft": sft, "partial": True}
    return figures, rows


def read_partial(root: Path, world: int) -> tuple[list[dict], list[dict], list[str]]:
    """(figures, rows, the demo directories read) of every demo under root/world{world}_*."""
    figures, rows, read = [], [], []
    demos = sorted(root.glob(f"world{world}_*"))
    done = [out for out in demos if (out / "summary.json").is_file() and (out / "runs.json").is_file()]
    for out in done:
        algorithms = tuple(sorted({r["algorithm"] for r in json.loads((out / "runs.json").read_text())}))
        world_fig, world_rows = world_figures(out, world, algorithms)
        figures.append(world_fig)
        rows += world_rows
        read.append(str(out))
    sft = figures[0]["sft"] if figures else None  # one SFT model per world: its baseline evaluated once
    for out in demos:
        if out in done or not (out / "rm" / "config.json").is_file():
            continue
        world_fig, world_rows = partial_figures(out, world, sft)
        figures.append(world_fig)
        rows += world_rows
        read.append(str(out))
    return figures, rows, read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=0, help="the world seed")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per algorithm")
    parser.add_argument("--root", default="runs/online_dpo_vs_dpo")
    parser.add_argument("--json", default="bench/results/online_dpo_vs_dpo.json")
    parser.add_argument("--partial", action="store_true", help="start nothing; read what has finished")
    args = parser.parse_args(argv)
    if args.partial:
        return report_partial(args)
    started = time.perf_counter()
    demos = {part: Path(args.root) / f"world{args.world}_{part}" for part in SPLIT}
    commands = {part: demo_command(args.world, args.seeds, out, SPLIT[part]) for part, out in demos.items()}
    running = {}
    for part, out in demos.items():
        if finished(out, commands[part]):
            print(f"{out}: finished earlier, skipped", flush=True)
            continue
        print(" ".join(commands[part]), flush=True)
        (out / "study_command.json").unlink(missing_ok=True)
        running[part] = subprocess.Popen([sys.executable, "-m", "rlhf", *commands[part][1:]])
    for part, process in running.items():
        if process.wait() != 0:
            raise SystemExit(f"{' '.join(commands[part])} failed with exit code {process.returncode}")
        (demos[part] / "study_command.json").write_text(json.dumps(commands[part]))
    rows, figures = [], []
    for part, out in demos.items():
        world, world_rows = world_figures(out, args.world, SPLIT[part])
        figures.append(world)
        rows += world_rows
    first, second = figures
    assert (
        first["sft"] == second["sft"]
        and first["reward_model"]["label_accuracy"] == second["reward_model"]["label_accuracy"]
    ), "the two demos must start from the same SFT model and reward model"
    table = aggregate(rows, ALGORITHMS, PAIRS)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "nice -n 15 env PYTHONPATH=. .venv/bin/python -m bench.studies.online_dpo_vs_dpo"
        + (f" --world {args.world}" if args.world else "")
        + (f" --seeds {args.seeds}" if args.seeds != 3 else ""),
        "demo_commands": [" ".join(c) for c in commands.values()],
        "settings": "the demo's defaults (100 RL iterations of 64 responses, 300 DPO steps, kl_budget 2)",
        "units": "gold gain = held-out gold reward minus the world's SFT model's (gold units); "
        "gold_gain_at_kl where the run's KL to SFT first reaches kl_budget (its last value if never); "
        "intervals: 95% t over seeds, differences paired by seed",
        "world": {k: v for k, v in first.items() if k != "demo_seconds"},
        "demo_seconds": [f["demo_seconds"] for f in figures],
        "runs": rows,
        "table": table,
        "bench_seconds": time.perf_counter() - started,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for algorithm in ALGORITHMS:
        row = table[algorithm]
        print(f"  {algorithm:10s} gain end {_fmt(row['gold_gain_end'])}  gain @KL {_fmt(row['gold_gain_at_kl'])}"
              f" ({row['reached_kl_budget']})  KL end {_fmt(row['kl_end'])}")  # fmt: skip
    for a, b in PAIRS:
        d = table[f"{a}_minus_{b}"]
        print(f"  {a} - {b}: end {_fmt(d['gold_gain_end'])} ({d['gold_gain_end']['verdict']}),"
              f" @KL {_fmt(d['gold_gain_at_kl'])} ({d['gold_gain_at_kl']['verdict']})")  # fmt: skip
    print(f"wrote {args.json}")
    return 0


def report_partial(args: argparse.Namespace) -> int:
    figures, rows, read = read_partial(Path(args.root), args.world)
    golds = {round(f["sft"]["gold_mean"], 6) for f in figures}
    assert len(golds) == 1, f"the demos must share one SFT model: SFT gold {golds}"
    present = tuple(a for a in ALGORITHMS if any(r["algorithm"] == a for r in rows))
    table = aggregate(rows, present, tuple(p for p in PAIRS if set(p) <= set(present)))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "nice -n 15 env PYTHONPATH=. .venv/bin/python -m bench.studies.online_dpo_vs_dpo --partial",
        "partial": "the runs finished when it was read: " + ", ".join(read),
        "settings": "the demo's defaults (100 RL iterations of 64 responses, 300 DPO steps, kl_budget 2)",
        "units": "as the full study's; a run read from its metrics.jsonl ends at its evaluation of iteration 95",
        "sft": figures[0]["sft"],
        "runs": rows,
        "table": table,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for algorithm in present:
        row = table[algorithm]
        seeds = sorted(r["seed"] for r in rows if r["algorithm"] == algorithm)
        print(f"  {algorithm:10s} seeds {seeds} gain end {_fmt(row['gold_gain_end'])}"
              f"  gain @KL {_fmt(row['gold_gain_at_kl'])} ({row['reached_kl_budget']})  KL end {_fmt(row['kl_end'])}")  # fmt: skip
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
