"""Compare the metrics.jsonl of two runs record by record (a refactor must not move a number).

    python bench/tools/compare_metrics.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl [--ignore KEY ...]

Prints the number of records, the largest absolute difference of every numeric key (time and
throughput keys left out), and every key present in one run only; exits 1 when a difference
exceeds --atol (default 1e-9) or a key or record is missing.
"""

from __future__ import annotations

import argparse
import json
import sys


def records(path: str) -> list[dict]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    skip = ("time/", "throughput/")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rows if "event" not in r]


def differences(a: list[dict], b: list[dict], ignore: set[str]) -> tuple[dict[str, float], set[str]]:
    worst: dict[str, float] = {}
    missing: set[str] = set()
    for x, y in zip(a, b):
        missing |= (set(x) ^ set(y)) - ignore
        for key in set(x) & set(y) - ignore:
            u, v = x[key], y[key]
            if isinstance(u, list) and isinstance(v, list) and len(u) == len(v):
                gap = max((abs(p - q) for p, q in zip(u, v)), default=0.0)
            elif isinstance(u, (int, float)) and not isinstance(u, bool) and isinstance(v, (int, float)):
                gap = abs(u - v)
            else:
                gap = 0.0 if u == v else float("inf")
            worst[key] = max(worst.get(key, 0.0), gap)
    return worst, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--ignore", nargs="*", default=[], help="keys to leave out")
    parser.add_argument("--atol", type=float, default=1e-9)
    args = parser.parse_args(argv)
    a, b = records(args.a), records(args.b)
    worst, missing = differences(a, b, set(args.ignore))
    print(f"records: {len(a)} vs {len(b)}")
    largest = max(worst.items(), key=lambda kv: kv[1], default=("-", 0.0))
    print(f"largest difference: {largest[1]:.3g} ({largest[0]})")
    over = {k: v for k, v in worst.items() if v > args.atol}
    for key, gap in sorted(over.items()):
        print(f"  over {args.atol:g}: {key} {gap:.3g}")
    for key in sorted(missing):
        print(f"  in one run only: {key}")
    return 0 if len(a) == len(b) and not over and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
