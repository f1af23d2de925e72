"""`rlhf serve-rm`: a reward model's scores over HTTP (the server: rlhf/stages/serve_rm.py;
docs/reward_server.md)."""

from __future__ import annotations

from rlhf.cli.flags import add_flags, flag, refuse_extra
from rlhf.cli.flags import safety_flags as safety

SERVE_RM = (
    flag("--reward-model", help="reward-model directory, `rlhf rm --out`"),
    flag("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0: every interface"),
    flag("--port", type=int, default=8000, help="port to listen on; 0: a free one (printed)"),
    flag("--batch-size", type=int, default=16, help="rows per forward of the reward model"),
    flag("--max-batch-rows", type=int, default=256, help="rows of waiting requests scored together at most"),
    flag(
        "--token-env",
        metavar="NAME",
        help="the environment variable holding the bearer token every request must send; off loopback, "
        "without it, a token is made and printed at start",
    ),
    flag(
        "--max-body-mb", type=float, default=64, help="request bodies larger than this are refused (HTTP 413)"
    ),
    flag("--device", default="auto", help="auto (CUDA when available, else CPU) | cpu | cuda:N"),
    flag("--dtype", default="auto", help="auto | float32 | bfloat16 | bfloat16-pure"),
)


def add_parser(sub, description: str) -> None:
    add_flags(sub.add_parser("serve-rm", help=description, description=description), (*SERVE_RM, *safety()))


def run_serve_rm_command(args, rest, ctx) -> int:
    from rlhf.stages.serve_rm import run_serve_rm

    refuse_extra(rest, "serve-rm")
    return run_serve_rm(args)
