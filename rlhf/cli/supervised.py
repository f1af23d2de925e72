"""`rlhf sft`, `rlhf rm` and `rlhf dpo`: --model, --data and --out over --config and dotted overrides
(the stages' bodies: rlhf/stages/sft.py, rm.py, dpo.py; the run opened by rlhf/rundir/open_run.py)."""

from __future__ import annotations

from rlhf.cli.flags import ALLOW_CHANGED_MODELS, SKIP_INVALID, add_flags, config_overrides, flag
from rlhf.cli.flags import safety_flags as safety

_CONFIG = flag("--config", help="YAML config file")
SFT = (
    flag("--model", key="model", help="base model directory (save_pretrained), hub id, or GGUF directory"),
    flag("--data", key="data.path", help="SFT data file (.jsonl/.json/.parquet)"),
    flag("--out", key="out", help="run directory"),
    _CONFIG,
)
RM = (
    flag("--model", key="model", help="initialization, usually the SFT run directory"),
    flag("--data", key="data.path", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat messages)"),
    flag("--out", key="out", help="run directory"),
    _CONFIG,
)
DPO = (
    flag("--model", key="model", help="the SFT model: trained, and frozen as the reference"),
    flag("--data", key="data.path", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat messages)"),
    flag("--out", key="out", help="run directory"),
    _CONFIG,
    flag(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last checkpoint (saved every --checkpoint.every N steps)",
    ),
    ALLOW_CHANGED_MODELS,
)
TABLES = {"sft": SFT, "rm": RM, "dpo": DPO}


def table(stage: str):
    """The flags of `rlhf STAGE`, in --help's order: its own, then the safety flags and --skip-invalid."""
    return (*TABLES[stage], *safety(), SKIP_INVALID)


def add_parsers(sub, descriptions: dict[str, str]) -> None:
    for stage in TABLES:
        add_flags(
            sub.add_parser(stage, help=descriptions[stage], description=descriptions[stage]), table(stage)
        )


def run_supervised_command(args, rest, ctx) -> int:
    from rlhf.rundir.open_run import RunRequest, open_run

    config_class, body = _stage(ctx.stage)
    flags = table(ctx.stage)
    request = RunRequest(
        stage=ctx.stage,
        config_class=config_class,
        file=args.config,
        overrides=config_overrides(args, rest, flags),
        resume=getattr(args, "resume", None),
        allow_changed_models=getattr(args, "resume_allow_changed_models", False),
    )
    with open_run(request, ctx) as run:
        if run.resumed:
            body(run.config, resume=True)
        else:
            body(run.config)
    return 0


def _stage(stage: str):
    """The config class and the body of a supervised stage (imported when it runs)."""
    if stage == "sft":
        from rlhf.config import SFTConfig
        from rlhf.stages.sft import run_sft

        return SFTConfig, run_sft
    if stage == "rm":
        from rlhf.config import RewardConfig
        from rlhf.stages.rm import run_reward_training

        return RewardConfig, run_reward_training
    from rlhf.config import DPOConfig
    from rlhf.stages.dpo import run_dpo

    return DPOConfig, run_dpo
