"""`rlhf train`: policy optimization against a reward model, reward functions, a reward server, an
environment or an agent (the body: rlhf/stages/train.py; the run opened by rlhf/rundir/open_run.py)."""

from __future__ import annotations

from rlhf.cli.flags import (
    ALLOW_CHANGED_MODELS,
    SKIP_INVALID,
    add_flags,
    config_overrides,
    flag,
    llm_judge_flags,
)
from rlhf.cli.flags import safety_flags as safety

TRAIN = (
    flag(
        "--preset",
        help="vanilla_ppo | ppo_max | apa | awr | grpo | rloo | reinforce_pp | dapo | gspo | cispo",
    ),
    flag("--policy", key="model.policy", help="SFT model directory (also the frozen reference)"),
    flag("--reward-model", key="model.reward_model", help="reward-model directory"),
    flag(
        "--reward-fn",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a Python reward function, added to the reward model's score (repeatable; weights: reward.functions)",
    ),
    flag(
        "--reward-url",
        key="reward.remote.url",
        metavar="URL",
        help="a reward server (`rlhf serve-rm`, docs/reward_server.md) instead of --reward-model "
        "(reward.remote.url)",
    ),
    flag(
        "--reward-token-env",
        key="reward.remote.token_env",
        metavar="NAME",
        help="the environment variable holding the reward server's bearer token (reward.remote.token_env; "
        "the name is recorded, never the token)",
    ),
    *llm_judge_flags("a score: a reward source beside the others", "reward.llm_judge"),
    flag(
        "--env",
        key="env.name",
        metavar="MODULE:CLASS",
        help="multi-turn episodes against a Python environment class (docs/environments.md; "
        "--env.max_turns N, --env.max_tokens N)",
    ),
    flag(
        "--agent",
        key="agent.name",
        metavar="MODULE:FUNCTION",
        help="episodes of your own agent, function(row, base_url, model) -> reward, against an "
        "OpenAI-compatible server over the policy (docs/environments.md; --agent.concurrency N)",
    ),
    flag("--prompts", key="data.prompts", help="prompts file"),
    flag("--out", key="out", help="run directory"),
    flag("--config", help="YAML config file"),
    flag("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint"),
    ALLOW_CHANGED_MODELS,
)


def table():
    """The flags of `rlhf train`, in --help's order: its own, then the safety flags and --skip-invalid."""
    return (*TRAIN, *safety(), SKIP_INVALID)


def add_parser(sub, description: str) -> None:
    add_flags(sub.add_parser("train", help=description, description=description), table())


def run_train_command(args, rest, ctx) -> int:
    from rlhf.config import RLConfig
    from rlhf.rundir.open_run import RunRequest, open_run
    from rlhf.stages.train import run_rl

    flags = table()
    request = RunRequest(
        stage="train",
        config_class=RLConfig,
        file=args.config,
        overrides=config_overrides(args, rest, flags),
        resume=args.resume,
        allow_changed_models=args.resume_allow_changed_models,
        preset=args.preset,
        reward_functions=tuple(args.reward_fn or ()),
        fit_to_machine=fit_ray_to_machine,
    )
    with open_run(request, ctx) as run:
        if run.resumed:
            run_rl(run.config, resume=True)
        else:
            run_rl(run.config)
    return 0


def fit_ray_to_machine(config, explicit: set[str]) -> str | None:
    """A Ray run: the roles' CPU reservations fit this machine (rlhf/ray_runtime/machine_fit.py,
    imported for a Ray run alone: it imports the trainer's modules)."""
    if config.dist.runtime != "ray":
        return None
    from rlhf.ray_runtime.machine_fit import fit_ray_to_machine as fit

    return fit(config, explicit)
