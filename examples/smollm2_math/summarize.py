"""The measured figures of a run.sh run as one JSON: greedy test accuracy of the SFT model and of every
RL policy with its Wilson 95% interval (`rlhf eval`'s eval_test.json), each policy's paired difference
to the SFT model on the same problems (t interval, wins / ties / losses), whether its interval lies
entirely above the SFT model's, the training reward of each RL run at its first and last iterations,
and wall time, CPU time and peak RSS per stage (GNU time -v).

    python examples/smollm2_math/summarize.py runs/smollm2_math [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from rlhf.evaluation.accuracy import paired_difference

VERIFIER = "rlhf.rl.verifiers:expression_answer"
TRAIN_KEYS = (
    "reward/raw_mean",
    "group/zero_std_fraction",
    "kl/ref",
    "response/length_mean",
    "policy/clip_fraction",
    "time/iteration",
)


def stage_cost(time_file: Path) -> dict | None:
    """Wall time (s), CPU time (s, user + system) and peak RSS (MiB) from a GNU `time -v` file."""
    if not time_file.is_file():
        return None
    text = time_file.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    seconds = 0.0
    for part in wall.group(1).split(":") if wall else ():
        seconds = seconds * 60 + float(part)
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", text))
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {
        "wall_s": round(seconds, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
    }


def accuracy(eval_file: Path, verifier: str) -> tuple[dict, list[float]] | None:
    """(the verifier's figures, its per-problem values) from an eval_test.json."""
    if not eval_file.is_file():
        return None
    result = json.loads(eval_file.read_text())
    figures = result["reward_functions"][verifier]
    values = [s["policy_function_scores"][verifier] for s in result["samples"]]
    return {k: figures[k] for k in ("mean", "ci95", "n", "correct") if k in figures}, values


def training_curve(run_dir: Path) -> dict | None:
    """The training figures at the first and the last iteration, and the mean over the last 3."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward/raw_mean" in r]
    if not rows:
        return None
    last3 = rows[-3:]
    return {
        "iterations": len(rows),
        "first": {k: rows[0].get(k) for k in TRAIN_KEYS},
        "last": {k: rows[-1].get(k) for k in TRAIN_KEYS},
        "reward_last3_mean": sum(r["reward/raw_mean"] for r in last3) / len(last3),
    }


def settings(run_dir: Path) -> dict:
    """The settings of an RL run that this recipe changes (its config.yaml)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    pick = {
        "rollout": (
            "batch_size",
            "samples_per_prompt",
            "max_new_tokens",
            "temperature",
            "max_sampling_rounds",
        ),
        "train": ("iterations", "minibatches"),
        "policy_optim": ("lr",),
        "critic_optim": ("lr",),
    }
    out = {"seed": config.get("seed")}
    for section, keys in pick.items():
        for key in keys:
            if key in config.get(section, {}):
                out[f"{section}.{key}"] = config[section][key]
    return out


def summarize(out: Path, verifier: str = VERIFIER) -> dict:
    base = accuracy(out / "sft" / "eval_test.json", verifier)
    result: dict = {"verifier": verifier, "sft": base[0] if base else None, "rl": {}, "stages": {}}
    for run_dir in sorted(p for p in out.iterdir() if (p / "config.yaml").is_file() and p.name != "sft"):
        entry: dict = {"settings": settings(run_dir), "training": training_curve(run_dir)}
        after = accuracy(run_dir / "eval_test.json", verifier)
        if after is not None:
            entry["test"] = after[0]
            if base is not None:
                entry["difference_to_sft"] = paired_difference(after[1], base[1])
                entry["interval_above_sft"] = after[0]["ci95"][0] > base[0]["ci95"][1]
        result["rl"][run_dir.name] = entry
    for time_file in sorted((out / "logs").glob("*.time")):
        result["stages"][time_file.stem] = stage_cost(time_file)
    result["total_wall_s"] = round(sum(s["wall_s"] for s in result["stages"].values() if s), 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="run.sh's OUT directory")
    parser.add_argument("--out", dest="file", type=Path, help="default: OUT/results.json")
    parser.add_argument("--verifier", default=VERIFIER)
    args = parser.parse_args()
    result = summarize(args.out, args.verifier)
    path = args.file or args.out / "results.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "stages"}, indent=2))
    print(f"written {path}")


if __name__ == "__main__":
    main()
