"""`rlhf rm-eval`: a reward model judged on preference pairs (the body: rlhf/stages/rm_eval.py). Each
named flag sets the RMEvalConfig key it names; every other key is a dotted override."""

from __future__ import annotations

from rlhf.cli.flags import DEVICE_FLAGS, SKIP_INVALID, add_flags, config_overrides, flag, scalar
from rlhf.cli.flags import safety_flags as safety

RM_EVAL = (
    flag("--reward-model", key="reward_model", help="reward-model directory, `rlhf rm --out` (reward_model)"),
    flag(
        "--data", key="data.path", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat) (data.path)"
    ),
    flag("--out", key="out", help="write rm_eval.json here (default: in the reward-model directory)"),
    flag(
        "--n",
        key="n",
        type=scalar,
        help="score only the first N valid pairs, N >= 1 (as in `rlhf eval`); no --n: every pair (n)",
    ),
    flag("--batch-size", key="batch_size", type=scalar, help="pairs per forward; 8 (batch_size)"),
    flag("--worst", key="worst", type=scalar, help="worst pairs (most negative margin) to keep; 10"),
    flag("--calibration-bins", key="calibration_bins", type=scalar, help="bins of sigmoid(|margin|); 10"),
    flag("--histogram-bins", key="histogram_bins", type=scalar, help="margin histogram bins (even); 10"),
    *DEVICE_FLAGS,
    flag("--config", help="YAML file of RMEvalConfig settings"),
)


def table():
    """The flags of `rlhf rm-eval`, in --help's order: its own, then the safety flags and --skip-invalid."""
    return (*RM_EVAL, *safety(), SKIP_INVALID)


def add_parser(sub, description: str) -> None:
    parser = sub.add_parser(
        "rm-eval",
        help=description,
        description=description + ". Each flag sets the RMEvalConfig key it names; any key is also a "
        "dotted override (--data.max_prompt_tokens 512) or a --config FILE.yaml setting.",
    )
    add_flags(parser, table())


def rm_eval_config(args, rest: list[str]):
    """The validated RMEvalConfig of `rlhf rm-eval ARGS` (the reward model's budgets under them)."""
    from rlhf.stages.rm_eval import rm_eval_config as build

    flags = table()
    return build(file=args.config, overrides=config_overrides(args, rest, flags))


def run_rm_eval_command(args, rest, ctx) -> int:
    from rlhf.rundir import preflight as checks
    from rlhf.stages.rm_eval import run_rm_eval

    config = rm_eval_config(args, rest)
    checks.preflight(config)
    run_rm_eval(config)
    return 0
