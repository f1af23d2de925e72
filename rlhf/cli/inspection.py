"""`rlhf data check FILE` (a dataset validated, its statistics printed: rlhf/data/check.py) and
`rlhf config STAGE` (every config key of a stage: rlhf/config/listing.py)."""

from __future__ import annotations

from rlhf.cli.flags import add_flags, refuse_extra
from rlhf.cli.flags import safety_flags as safety


def add_data_parser(sub, description: str) -> None:
    from rlhf.data.check import add_check_arguments

    data = sub.add_parser("data", help=description, description=description)
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    check = data_sub.add_parser("check", help="validate a dataset file and print its statistics")
    add_check_arguments(check)
    add_flags(check, safety())


def add_config_parser(sub, description: str) -> None:
    """`rlhf config STAGE`, and the config groups named at the end of each stage's --help."""
    from rlhf.config.listing import help_epilog
    from rlhf.config.stages import STAGE_CONFIGS

    for stage in STAGE_CONFIGS:
        sub.choices[stage].epilog = help_epilog(stage)
    config = sub.add_parser("config", help=description, description=description)
    config.add_argument(
        "config_stage", metavar="STAGE", choices=list(STAGE_CONFIGS), help="the command whose keys to list"
    )
    config.add_argument("--preset", help="rlhf train: show this preset's values (marked *)")


def run_data_command(args, rest, ctx, parser) -> int:
    if args.data_command != "check":
        parser.parse_args(["data", "--help"])
    refuse_extra(rest, "data check")
    from rlhf.data.check import run_check
    from rlhf.rundir.preflight import check_input_file

    check_input_file(args.file, "FILE")
    return run_check(args)


def run_config_command(args, rest, ctx) -> int:
    from rlhf.config.listing import render

    refuse_extra(rest, "config")
    print(render(args.config_stage, args.preset))
    return 0
