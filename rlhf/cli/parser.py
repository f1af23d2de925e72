"""The `rlhf` argument parser: one sub-command per stage, each declared by its own module's flag table."""

from __future__ import annotations

import argparse

STAGES = {
    "demo": "run the whole pipeline on the built-in world and write report.html",
    "ablate": "a preset with each PPO trick switched alone, over seeds, on the built-in world",
    "sft": "supervised fine-tuning of a causal LM on prompt/response data",
    "rm": "train a reward model on preference pairs (ranking + LM loss)",
    "dpo": "train the SFT model directly on preference pairs: DPO, IPO, robust DPO or SimPO (no reward model)",
    "train": "policy optimization against a reward model and/or reward functions: PPO, PPO-max, APA, AWR, "
    "GRPO, RLOO, REINFORCE++",
    "eval": "mean reward and win rate of one policy against another on held-out prompts, or a policy's "
    "accuracy on a verifiable task",
    "rm-eval": "judge a reward model on preference pairs: accuracy, margins, calibration, worst pairs",
    "data": "inspect and validate datasets: `rlhf data check FILE`",
    "plan": "per-rank memory of an RL run, role by role and phase by phase, and whether it fits",
    "serve-rm": "serve a reward model's scores over HTTP for `rlhf train --reward-url` (docs/reward_server.md)",
    "report": "render report.html of a training run (sft, rm, dpo, train) or a demo output directory",
    "config": "list every config key of a stage: type, default, range, when it applies, doc",
}

EPILOG = """examples:
  rlhf sft   --model MODEL_DIR --data sft.jsonl --out runs/sft
  rlhf rm    --model runs/sft --data pairs.jsonl --out runs/rm
  rlhf train --preset ppo_max --policy runs/sft --reward-model runs/rm --prompts prompts.jsonl --out runs/ppo
  rlhf train --resume runs/ppo
  rlhf eval  --policy runs/ppo --baseline runs/sft --judge runs/rm --prompts test.jsonl
  rlhf rm-eval --reward-model runs/rm --data test_pairs.jsonl
Any config field can be overridden: --train.iterations 20 --kl.beta 0.05 --seed 1"""


def build_parser() -> argparse.ArgumentParser:
    from rlhf.cli import demo, eval, inspection, plan, report, rm_eval, serve_rm, supervised, train

    parser = argparse.ArgumentParser(
        prog="rlhf",
        description="RLHF end to end: SFT, reward model, PPO / PPO-max / APA / AWR / GRPO / Dr. GRPO / "
        "RLOO / REINFORCE++, evaluation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    demo.add_parsers(sub, STAGES)
    supervised.add_parsers(sub, STAGES)
    train.add_parser(sub, STAGES["train"])
    eval.add_parser(sub, STAGES["eval"])
    rm_eval.add_parser(sub, STAGES["rm-eval"])
    plan.add_parser(sub, STAGES["plan"])
    serve_rm.add_parser(sub, STAGES["serve-rm"])
    inspection.add_data_parser(sub, STAGES["data"])
    report.add_parser(sub, STAGES["report"])
    inspection.add_config_parser(sub, STAGES["config"])  # last: it sets every stage's --help epilog
    return parser
