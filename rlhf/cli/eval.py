"""`rlhf eval`: a policy against a baseline on held-out prompts (judged by reward models or a world's
gold reward), its accuracy under reward functions, or its preference on held-out pairs (the body:
rlhf/stages/eval.py). Each named flag sets the EvalConfig key it names; every other key is a dotted
override (`--rollout.top_p 0.9`)."""

from __future__ import annotations

from rlhf.cli.flags import (
    DEVICE_FLAGS,
    SKIP_INVALID,
    add_flags,
    flag,
    flag_names,
    llm_judge_flags,
    named_values,
    overrides,
    scalar,
)
from rlhf.cli.flags import safety_flags as safety

EVAL = (
    flag("--policy", key="policy", help="policy directory to evaluate (policy)"),
    flag(
        "--baseline",
        key="baseline",
        help="policy directory to compare against; not needed with --reward-fn alone (baseline)",
    ),
    flag(
        "--judge",
        key="judge",  # the first; the others go to extra_judges (eval_config)
        action="append",
        help="reward-model directory (or 'world:DIR' for a built-in world's gold reward) (judge); "
        "repeated: every judge scores the same answers, each with its own figures (extra_judges)",
    ),
    flag(
        "--reward-fn",
        key="reward_functions",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a Python reward function (repeatable): its mean on the policy's answers with a 95%% interval "
        "(Wilson for a 0/1 verifier: the accuracy), with --baseline the paired difference; added to the "
        "--judge's score (reward_functions)",
    ),
    *llm_judge_flags("a verdict on each pair of answers, asked twice in swapped order", "llm_judge"),
    flag("--prompts", key="data.prompts", help="held-out prompts file (data.prompts)"),
    flag(
        "--pairs",
        key="data.pairs",
        help="held-out preference pairs: the share where the policy raised the chosen response's "
        "log-ratio to --baseline above the rejected one's, eval.json's \"pairs\"; needs no judge "
        "(data.pairs; docs/algorithms.md §38)",
    ),
    flag(
        "--pairs-n",
        key="data.pairs_n",
        type=scalar,
        help="the first N valid pairs; default all (data.pairs_n)",
    ),
    flag("--out", key="out", help="write eval.json here (default: beside the policy) (out)"),
    flag(
        "--n",
        key="data.n",
        type=scalar,
        help="prompts to evaluate, the first N, N >= 1 (as in `rlhf rm-eval`); 256 (data.n)",
    ),
    flag(
        "--max-new-tokens",
        key="rollout.max_new_tokens",
        type=scalar,
        help="response budget; 64 (rollout.max_new_tokens)",
    ),
    flag(
        "--max-prompt-tokens",
        key="data.max_prompt_tokens",
        type=scalar,
        help="prompt budget in tokens, oldest dialogue turns dropped first (default: the --policy run's "
        "data.max_prompt_tokens from its config.yaml, else 512) (data.max_prompt_tokens)",
    ),
    flag(
        "--temperature",
        key="rollout.temperature",
        type=scalar,
        help="sampling temperature; 0: greedy; 1.0 (rollout.temperature)",
    ),
    flag("--top-p", key="rollout.top_p", type=scalar, help="nucleus sampling; 1.0 (rollout.top_p)"),
    flag(
        "--sampling",
        key="rollout.sampling",
        type=scalar,
        help="custom | paper: the PPO paper §6.1 sampling (temperature 0.8, top-p 0.9, repetition penalty "
        "1.1) instead of --temperature/--top-p (rollout.sampling)",
    ),
    flag("--seed", key="seed", type=scalar, help="sampling seed; 0 (seed)"),
    *DEVICE_FLAGS,
    flag(
        "--chat-template",
        key="data.chat_template",
        type=scalar,
        help="auto | true | false: render HH dialogues and messages with the policy tokenizer's chat "
        "template and stop at its end-of-turn token (auto: when it has one) (data.chat_template)",
    ),
    flag("--config", help="YAML file of EvalConfig settings"),
)


def table():
    """The flags of `rlhf eval`, in --help's order: its own, then the safety flags and --skip-invalid."""
    return (*EVAL, *safety(), SKIP_INVALID)


def add_parser(sub, description: str) -> None:
    parser = sub.add_parser(
        "eval",
        help=description,
        description=description + ". Each flag sets the EvalConfig key it names; any key is also a "
        "dotted override (--rollout.top_p 0.9) or a --config FILE.yaml setting.",
    )
    add_flags(parser, table())


def eval_config(args, rest: list[str]):
    """The validated EvalConfig of `rlhf eval ARGS`: --config < named flags < dotted overrides."""
    from rlhf.config import EvalConfig, load_config

    flags = table()
    named = named_values(args, flags)
    judges = named.pop("judge") or []  # --judge A --judge B: A is `judge`, B on `extra_judges`
    named["judge"] = judges[0] if judges else None
    named["extra_judges"] = judges[1:] or None
    return load_config(EvalConfig, file=args.config, overrides=overrides(rest, named, flag_names(flags)))


def run_eval_command(args, rest, ctx) -> int:
    from rlhf.rundir import preflight as checks
    from rlhf.stages.eval import run_eval

    config = eval_config(args, rest)
    checks.preflight(config)
    run_eval(config)
    return 0
