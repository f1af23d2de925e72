"""The reward-server demo, last step: the run scored over HTTP against the run scored locally.

    python examples/reward_server/compare.py runs/reward_server/grpo_remote runs/reward_server/grpo_local

Reads each run's metrics.jsonl and prints, per iteration, `reward/raw_mean` of both runs and the
largest difference between their `reward/raw_scores` (every response's reward-model score). They
match when every difference is within --tol (the server's scores equal the local reward model's to
float rounding, docs/reward_server.md); exit 0 then, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def iterations(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row for row in rows if "iteration" in row and "reward/raw_mean" in row]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("remote", type=Path, help="the --reward-url run")
    parser.add_argument("local", type=Path, help="the --reward-model run")
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    remote, local = iterations(args.remote), iterations(args.local)
    if not remote or len(remote) != len(local):
        print(f"MISMATCH: {len(remote)} iterations logged by {args.remote}, {len(local)} by {args.local}")
        return 1
    worst = 0.0
    print(
        f"{'iteration':>9}  {'raw_mean (--reward-url)':>23}  {'raw_mean (--reward-model)':>25}  max |score diff|"
    )
    for a, b in zip(remote, local):
        scores_a, scores_b = a.get("reward/raw_scores", []), b.get("reward/raw_scores", [])
        if len(scores_a) != len(scores_b):
            print(
                f"MISMATCH: iteration {a['iteration']} scored {len(scores_a)} and {len(scores_b)} responses"
            )
            return 1
        diffs = [abs(x - y) for x, y in zip(scores_a, scores_b)] + [
            abs(a["reward/raw_mean"] - b["reward/raw_mean"])
        ]
        worst = max(worst, *diffs)
        print(
            f"{a['iteration']:>9}  {a['reward/raw_mean']:>23.6f}  {b['reward/raw_mean']:>25.6f}  {max(diffs):.2e}"
        )
    if worst > args.tol:
        print(f"MISMATCH: the scores differ by up to {worst:.2e}, more than --tol {args.tol:g}")
        return 1
    print(
        f"MATCH: the reward server's scores equal the local reward model's over {len(remote)} iterations "
        f"(largest difference {worst:.2e}, tolerance {args.tol:g})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
