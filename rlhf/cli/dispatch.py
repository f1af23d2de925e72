"""`main`: parse the command line, set this command's model-loading policy, and run the stage's
command through the one error path (errors.py)."""

from __future__ import annotations

import os


def main(argv: list[str] | None = None) -> int:
    from rlhf.cli.parser import build_parser

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.stage is None:
        parser.print_help()
        return 0
    from transformers.utils import logging as hf_logging

    from rlhf.cli.errors import run_with_one_error_path
    from rlhf.models.trust import set_load_policy
    from rlhf.parallel.threads import limit_threads

    hf_logging.disable_progress_bar()  # our own progress display replaces transformers' load/save bars
    limit_threads()  # OMP_NUM_THREADS, else the cores this process may use (affinity, cgroup quota)
    set_load_policy(
        trust_remote_code=getattr(args, "trust_remote_code", False),
        allow_pickle=getattr(args, "allow_pickle", False),
    )
    try:
        return run_with_one_error_path(args.stage, lambda ctx: dispatch(parser, args, rest, ctx))
    finally:
        set_load_policy()  # the flags hold for this command only (main() may be called in-process)


def dispatch(parser, args, rest, ctx) -> int:
    """Run `args.stage`'s command (each looked up when called: its module imports the stage's code)."""
    from rlhf.cli import demo, eval, inspection, plan, report, rm_eval, serve_rm, supervised, train

    refuse_data_parallel_launch(args.stage)
    if args.stage == "data":
        return inspection.run_data_command(args, rest, ctx, parser)
    handler = {
        "sft": supervised.run_supervised_command,
        "rm": supervised.run_supervised_command,
        "dpo": supervised.run_supervised_command,
        "train": train.run_train_command,
        "eval": eval.run_eval_command,
        "rm-eval": rm_eval.run_rm_eval_command,
        "demo": demo.run_demo_command,
        "ablate": demo.run_ablate_command,
        "report": report.run_report_command,
        "plan": plan.run_plan_command,
        "serve-rm": serve_rm.run_serve_rm_command,
        "config": inspection.run_config_command,
    }[args.stage]
    return handler(args, rest, ctx)


def refuse_data_parallel_launch(stage: str) -> None:
    """Only sft, rm, dpo and train run data-parallel; under torchrun with several processes the other
    stages would each run whole and write the same files."""
    from rlhf.parallel.process_group import launch_world_size

    if stage not in ("sft", "rm", "dpo", "train") and launch_world_size() > 1:
        from rlhf.config import ConfigError

        raise ConfigError(
            f"rlhf {stage} runs in one process, but torchrun started {launch_world_size()}. "
            f"Fix: run `rlhf {stage} ...` (or `python -m rlhf {stage} ...`) without torchrun."
        )
