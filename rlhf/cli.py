"""The `rlhf` command. Each stage lives in its own module; this file only parses and dispatches."""

from __future__ import annotations

import argparse
import sys

STAGES = {
    "demo": "run the whole pipeline on the built-in world and write a report (not built yet)",
    "sft": "supervised fine-tuning of a causal LM (not built yet)",
    "rm": "train a reward model on preference pairs (not built yet)",
    "train": "policy optimization: PPO, PPO-max, APA, AWR (not built yet)",
    "eval": "reward and win rate of one policy against another (not built yet)",
    "data": "inspect and validate datasets: `rlhf data check FILE` (not built yet)",
    "report": "render report.html from run directories (not built yet)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf", description="RLHF: SFT, reward model, PPO-max, APA, AWR.")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    for name, help_text in STAGES.items():
        sub.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, _ = parser.parse_known_args(argv)
    if args.stage is None:
        parser.print_help()
        return 0
    print(f"rlhf {args.stage}: not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
