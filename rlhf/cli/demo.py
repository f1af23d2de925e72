"""`rlhf demo` and `rlhf ablate`: the built-in world (the bodies: rlhf/demo/run.py, rlhf/demo/ablate/);
each owns its --out folder (rlhf/rundir/open_run.py `open_output_dir`)."""

from __future__ import annotations

from rlhf.cli.flags import add_flags, flag, positive_int

DEMO = (
    flag("--out", default="runs/demo", help="output directory (report.html, summary.json)"),
    flag(
        "--compare",
        action="store_true",
        help="run vanilla PPO, PPO-max, APA, AWR, GRPO and RLOO side by side",
    ),
    flag(
        "--compare-only",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        metavar="NAMES",
        help="--compare with only these runs, comma-separated (e.g. ppo_max,dpo)",
    ),
    flag("--seeds", type=positive_int, default=1, help="seeds per algorithm"),
    flag("--config", help="YAML file of demo settings"),
)
ABLATE = (
    flag("--preset", default="ppo_max", help="the preset whose tricks are switched"),
    flag("--seeds", type=int, default=3, help="seeds per variant (95%% intervals over them)"),
    flag("--out", default="runs/ablate", help="output directory (ablation.json, report.html)"),
    flag("--jobs", type=int, default=1, help="runs at a time, one process each"),
    flag("--kl-budget", type=float, default=2.0, help="KL at which the gold gain is read"),
    flag(
        "--add-trick",
        action="append",
        default=[],
        metavar="NAME",
        help="ablate a later paper's switch too: gspo | cispo | clip_cov | kl_cov | rollout_correction",
    ),
    flag(
        "--add-arm",
        action="append",
        default=[],
        metavar="PRESET",
        help="run another preset beside the variants, paired by seed (e.g. online_dpo)",
    ),
    flag("--config", help="YAML file of demo settings (world, model, steps, iterations)"),
)


def add_parsers(sub, descriptions: dict[str, str]) -> None:
    for name, table in (("demo", DEMO), ("ablate", ABLATE)):
        add_flags(sub.add_parser(name, help=descriptions[name], description=descriptions[name]), table)


def run_demo_command(args, rest, ctx) -> int:
    from rlhf.demo.run import run_demo
    from rlhf.rundir.open_run import open_output_dir
    from rlhf.rundir.outputs import DEMO_OUTPUTS

    # the demo clears its earlier outputs: never a folder of anything else
    with open_output_dir(args.out, "demo", args.config, ctx, leftovers=DEMO_OUTPUTS):
        return run_demo(
            out=args.out,
            compare=args.compare,
            seeds=args.seeds,
            config_file=args.config,
            overrides=rest,
            compare_only=args.compare_only,
        )


def run_ablate_command(args, rest, ctx) -> int:
    from rlhf.demo.ablate import run_ablation
    from rlhf.rundir.open_run import open_output_dir
    from rlhf.rundir.outputs import ABLATE_OUTPUTS

    # the ablation resumes from its own outputs and clears them: never a folder of anything else
    with open_output_dir(args.out, "ablate", args.config, ctx, leftovers=ABLATE_OUTPUTS, every_output=True):
        return run_ablation(
            out=args.out,
            preset=args.preset,
            seeds=args.seeds,
            jobs=args.jobs,
            kl_budget=args.kl_budget,
            config_file=args.config,
            overrides=rest,
            extra_tricks=tuple(args.add_trick),
            arms=tuple(args.add_arm),
        )
