"""How many HH pairs a SmolLM2-135M judge needs: held-out accuracy against the number of training
pairs, and at one size full fine-tuning against LoRA, two epochs against one and the LM-loss
coefficient 0 against the default 1 (the PPO paper §4's ranking + LM loss).

    python examples/smollm2_hh/judge_curve.py --out runs/smollm2_hh_judges [--model DIR]
    python examples/smollm2_hh/judge_curve.py --out ... --points lora:200 lora:400 full:400   # some points

run.sh's prepare and sft stages first (into --out; a done stage is skipped), then one `rlhf rm` per
point on the first N pairs of data/judge_pool.jsonl (every training pair, judge 1's and judge 2's, in
the split's random prompt-group order: the sizes are nested) with run.sh's judge flags, and
`rlhf rm-eval` of each on the same held-out pairs. A point already measured (its point.json) is
kept. Writes --results (every point: N, setting, accuracy with its Wilson 95% interval, steps, wall
times, the exact commands) and a PNG of the curve beside it. Only the `rlhf` CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from summarize import judge_figures  # noqa: E402  (its neighbour: the figures of a judge's rm_eval.json)

# setting -> its flags beside the shared ones (run.sh's judge is `full`: full fine-tuning at 2e-5, one
# epoch, lm_coef 1; `lora`: LoRA r 16 at 2e-4, run.sh's RM_LORA=true)
LORA = ["--lora.enabled", "true", "--lora.r", "16", "--lora.alpha", "32", "--optim.lr", "2e-4"]
FULL = ["--lora.enabled", "false", "--optim.lr", "2e-5"]
SETTINGS = {
    "lora": [*LORA, "--train.epochs", "1"],
    "full": [*FULL, "--train.epochs", "1"],
    "full_2ep": [*FULL, "--train.epochs", "2"],
    "lora_2ep": [*LORA, "--train.epochs", "2"],
    "lora_lm0": [*LORA, "--train.epochs", "1", "--train.lm_coef", "0"],
}
POINT_KEYS = ("train_wall_s", "eval_wall_s", "commands")  # point.json: what rm_eval.json does not hold
DEFAULT_POINTS = [
    "lora:200",
    "lora:400",
    "lora:800",
    "full:200",
    "full:400",
    "full:800",
    "full:all",
    "full_2ep:400",
    "lora_lm0:400",
]


def judge_command(rlhf: list[str], out: Path, pairs: Path, run: Path, setting: str, args) -> list[str]:
    """run.sh's rm_stage with the setting's flags."""
    return [*rlhf, "rm", "--model", str(out / "sft"), "--data", str(pairs), "--out", str(run),
            "--train.batch_size", "8", "--train.micro_batch_size", "8",
            "--data.max_prompt_tokens", str(args.prompt_tokens), "--data.max_response_tokens", "32",
            "--data.system_prompt", "none", "--data.test_fraction", "0.02",
            "--optim.warmup_steps", "3", "--optim.warmup_fraction", "0",
            "--train.log_every", "1", "--train.eval_every", "1000", *SETTINGS[setting]]  # fmt: skip


def timed(command: list[str], log: Path) -> float:
    print("==", shlex.join(command), flush=True)
    start = time.monotonic()
    with open(log, "w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"exit {code}: {shlex.join(command)} (log: {log})")
    return time.monotonic() - start


def steps_of(run: Path) -> int:
    """Optimizer steps the run took (its metrics.jsonl's train rows)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return 1 + max(row["step"] for row in rows if "train/loss" in row)


def measure(point: str, pool: list[str], out: Path, rlhf: list[str], args) -> dict:
    setting, _, size = point.partition(":")
    if setting not in SETTINGS:
        sys.exit(f"--points {point}: unknown setting {setting!r}; one of {', '.join(SETTINGS)}")
    n = len(pool) if size == "all" else int(size)
    run = out / "judges" / f"{setting}_{n}"
    if not (run / "point.json").is_file():
        run.parent.mkdir(parents=True, exist_ok=True)
        pairs = out / "judges" / f"pairs_{n}.jsonl"
        pairs.write_text("".join(pool[:n]))
        train = judge_command(rlhf, out, pairs, run, setting, args)
        train_s = timed(train, out / "logs" / f"judge_{setting}_{n}.log")
        heldout = out / "data" / "rm_heldout.jsonl"
        evaluate = [*rlhf, "rm-eval", "--reward-model", str(run), "--data", str(heldout), "--n", str(args.heldout),
                    "--skip-invalid"]  # fmt: skip
        eval_s = timed(evaluate, out / "logs" / f"judge_{setting}_{n}_eval.log")
        cost = {"train_wall_s": round(train_s, 1), "eval_wall_s": round(eval_s, 1)}
        commands = {"commands": [shlex.join(train), shlex.join(evaluate)]}
        (run / "point.json").write_text(json.dumps({**cost, **commands}, indent=2) + "\n")
    measured = {k: v for k, v in json.loads((run / "point.json").read_text()).items() if k in POINT_KEYS}
    figures = judge_figures(json.loads((run / "rm_eval.json").read_text()))  # summarize.py's figures
    return {"setting": setting, "pairs": n, "steps": steps_of(run), **figures, **measured}


def plot(points: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"lora": "o-", "full": "s-", "full_2ep": "D", "lora_2ep": "^", "lora_lm0": "v"}
    for shift, setting in enumerate(SETTINGS):  # the settings at one N side by side, not on top
        rows = sorted((p for p in points if p["setting"] == setting), key=lambda p: p["pairs"])
        if not rows:
            continue
        x = [p["pairs"] + 12 * shift for p in rows]
        y = [p["accuracy"] for p in rows]
        err = [
            [p["accuracy"] - p["accuracy_ci95"][0] for p in rows],
            [p["accuracy_ci95"][1] - p["accuracy"] for p in rows],
        ]
        ax.errorbar(x, y, yerr=err, fmt=styles[setting], capsize=3, label=setting)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training pairs")
    ax.set_ylabel(f"held-out accuracy ({points[0]['n']} pairs, Wilson 95%)")
    ax.set_title("SmolLM2-135M judge on HH harmless-base")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smollm2_hh_judges", help="run.sh's OUT: data, sft, judges/")
    parser.add_argument("--model", default=os.environ.get("MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct"))
    parser.add_argument("--points", nargs="+", default=DEFAULT_POINTS, help="SETTING:N (N or all), in order")
    parser.add_argument("--heldout", type=int, default=300, help="held-out pairs every judge is scored on")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--results", default=str(HERE / "results" / "judge_curve.json"))
    parser.add_argument("--rlhf", default=os.environ.get("RLHF", "rlhf"), help='e.g. "python -m rlhf.cli"')
    args = parser.parse_args()
    out, rlhf = Path(args.out), shlex.split(args.rlhf)
    env = {**os.environ, "OUT": str(out), "MODEL": args.model, "UNTIL": "sft", "RLHF": args.rlhf,
           "PROMPT_TOKENS": str(args.prompt_tokens)}  # fmt: skip
    subprocess.run(["bash", str(HERE / "run.sh")], env=env, check=True)  # prepare + sft
    pool_file = out / "data" / "judge_pool.jsonl"
    if not pool_file.is_file():
        sys.exit(f"{pool_file} is missing: {out}/data was split by an older prepare.py; remove it and rerun")
    pool = pool_file.read_text().splitlines(keepends=True)
    points = []
    for point in args.points:
        points.append(measure(point, pool, out, rlhf, args))
        print(
            json.dumps(
                {k: points[-1][k] for k in ("setting", "pairs", "accuracy", "accuracy_ci95", "train_wall_s")}
            )
        )
        results = Path(args.results)
        results.parent.mkdir(parents=True, exist_ok=True)
        model = "a local directory (MODEL)" if os.path.isabs(args.model) else args.model  # no machine path
        summary = {"model": model, "heldout_pairs": args.heldout, "pool_pairs": len(pool), "points": points}
        results.write_text(json.dumps(summary, indent=2) + "\n")
        plot(points, results.with_suffix(".png"))


if __name__ == "__main__":
    main()
