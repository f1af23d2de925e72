"""Time `rlhf demo` and `rlhf demo --compare --seeds 3` and record their findings.

    .venv/bin/python bench/speed/demo_timing.py [--skip-compare] [--seeds 3] [--keep DIR]

Writes bench/results/demo.json: wall seconds of each command, the phases' seconds from
summary.json, and the findings (each claim with whether it held and the evidence).
Targets: `rlhf demo` within 5 minutes, `--compare --seeds 3` within 20, on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RLHF = Path(sys.executable).with_name("rlhf")


def timed_demo(extra: list[str], out: Path) -> dict:
    started = time.perf_counter()
    subprocess.run([str(RLHF), "demo", "--out", str(out), *extra], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    return {
        "command": " ".join(["rlhf", "demo", *extra]),
        "wall_seconds": round(wall, 1),
        "sft_seconds": round(summary["sft"]["seconds"], 1),
        "reward_model_seconds": round(summary["reward_model"]["seconds"], 1),
        "rl_run_seconds": [round(r["seconds"], 1) for r in summary["runs"]],
        "sft": {k: summary["sft"][k] for k in ("gold_mean", "gold_std", "proxy_mean")},
        "reward_model": {k: summary["reward_model"][k] for k in ("label_accuracy", "gold_accuracy")},
        "runs": [
            {k: r[k] for k in ("algorithm", "seed", "final", "peak_gold", "collapse_detected")}
            for r in summary["runs"]
        ],
        "findings": summary["findings"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-compare", action="store_true", help="time only the PPO-max demo")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="keep the demos' output directories under DIR")
    args = parser.parse_args()
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "targets_seconds": {"demo": 300, "compare": 1200}}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        results["demo"] = timed_demo([], Path(tmp) / "demo")
        print(f"rlhf demo: {results['demo']['wall_seconds']} s (target 300)")
        if not args.skip_compare:
            results["compare"] = timed_demo(["--compare", "--seeds", str(args.seeds)], Path(tmp) / "compare")
            print(
                f"rlhf demo --compare --seeds {args.seeds}: {results['compare']['wall_seconds']} s (target 1200)"
            )
            for finding in results["compare"]["findings"]:
                print(f"  [{'holds' if finding['holds'] else 'FAILS'}] {finding['claim']}")
    out = ROOT / "bench" / "results" / "demo.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
