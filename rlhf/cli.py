"""The `rlhf` command. Each stage lives in its own module; this file only parses and dispatches.

    rlhf sft   --model MODEL_DIR --data sft.jsonl --out runs/sft
    rlhf rm    --model runs/sft --data pairs.jsonl --out runs/rm
    rlhf dpo   --model runs/sft --data pairs.jsonl --out runs/dpo [--checkpoint.every 100]
    rlhf dpo   --resume runs/dpo
    rlhf train --preset ppo_max --policy runs/sft --reward-model runs/rm --prompts prompts.jsonl --out runs/ppo
    rlhf train --resume runs/ppo
    rlhf eval  --policy runs/ppo --baseline runs/sft --judge runs/rm --prompts test.jsonl
    rlhf eval  --policy runs/ppo --baseline runs/sft --pairs test_pairs.jsonl
    rlhf eval  --policy runs/grpo --reward-fn rlhf.rl.verifiers:numeric_answer --prompts test.jsonl
    rlhf rm-eval --reward-model runs/rm --data test_pairs.jsonl
    rlhf serve-rm --reward-model runs/rm --port 8000    # then: rlhf train ... --reward-url http://127.0.0.1:8000

Every stage also takes `--config FILE.yaml` and dotted overrides of any config field
(`--train.iterations 20`, `--kl.beta 0.05`, `--seed 1`); a named flag (`--policy`, `--n`) sets the
config key it names (rlhf/config/).

Model directories are data: their Python code never runs and their pickle weights are never read
unless `--trust-remote-code` / `--allow-pickle` say so (rlhf/models/trust.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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


def _scalar(raw: str):
    """A named flag's value read as a dotted override's is (YAML scalar: 4, 0.5, true, null)."""
    from rlhf.config import parse_overrides

    return parse_overrides(["--value", raw])["value"]


def _positive_int(raw: str) -> int:
    """An argparse type: a whole number >= 1 (a count of seeds, jobs, GPUs)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {raw!r}. Fix: e.g. 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}. Fix: e.g. 1")
    return value


def _memory_size(raw: str) -> str:
    """--gpu-memory: a size with its unit (80GB, 24GiB, 512MB); a bare number is refused, since 80
    could be GB or bytes."""
    import re

    text = str(raw).strip().lower().replace(" ", "")
    number = re.fullmatch(r"(\d+(\.\d+)?)(gib|gb|g|mib|mb|m)?", text)
    if number is None:
        raise argparse.ArgumentTypeError(
            f"must be a size like 80GB or 24GiB, got {raw!r}. Fix: --gpu-memory 80GB"
        )
    if number.group(3) is None:
        raise argparse.ArgumentTypeError(
            f"{raw!r} has no unit (GB? bytes?). Fix: --gpu-memory {number.group(1)}GB (or MiB, GiB)"
        )
    if float(number.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {raw!r}. Fix: --gpu-memory 80GB")
    return raw


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype of eval and rm-eval (the `device` and `dtype` keys of their configs)."""
    parser.add_argument("--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N")
    parser.add_argument(
        "--dtype",
        type=_scalar,
        help="auto (bfloat16 on a GPU, float32 on a CPU) | float32 | bfloat16 (autocast) | bfloat16-pure",
    )


# Named flags of eval and rm-eval -> the config keys they set (argparse dest -> dotted key); every
# other key of EvalConfig / RMEvalConfig is a dotted override (`--rollout.top_p 0.9`).
EVAL_FLAGS = {
    "policy": "policy",
    "baseline": "baseline",
    "judge": "judge",
    "reward_fn": "reward_functions",
    "prompts": "data.prompts",
    "pairs": "data.pairs",
    "pairs_n": "data.pairs_n",
    "out": "out",
    "n": "data.n",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_prompt_tokens": "data.max_prompt_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "sampling": "rollout.sampling",
    "seed": "seed",
    "device": "device",
    "dtype": "dtype",
    "chat_template": "data.chat_template",
    "skip_invalid": "data.skip_invalid",
    "judge_url": "llm_judge.url",
    "judge_model": "llm_judge.model",
    "judge_key_env": "llm_judge.key_env",
    "judge_template": "llm_judge.template",
}
RM_EVAL_FLAGS = {
    "reward_model": "reward_model",
    "data": "data.path",
    "out": "out",
    "n": "n",
    "batch_size": "batch_size",
    "worst": "worst",
    "calibration_bins": "calibration_bins",
    "histogram_bins": "histogram_bins",
    "device": "device",
    "dtype": "dtype",
    "skip_invalid": "data.skip_invalid",
}

# dotted key -> the named flag that sets it (for the message when both are given)
SUPERVISED_FLAGS = {
    "model": "--model",
    "data.path": "--data",
    "out": "--out",
    "data.skip_invalid": "--skip-invalid",
}
TRAIN_FLAGS = {
    "model.policy": "--policy",
    "model.reward_model": "--reward-model",
    "data.prompts": "--prompts",
    "out": "--out",
    "data.skip_invalid": "--skip-invalid",
    "reward.remote.token_env": "--reward-token-env",
    "reward.llm_judge.url": "--judge-url",
    "reward.llm_judge.model": "--judge-model",
    "reward.llm_judge.key_env": "--judge-key-env",
    "reward.llm_judge.template": "--judge-template",
}


def _flag_names(flags: dict[str, str]) -> dict[str, str]:
    """{argparse dest: dotted key} -> {dotted key: "--flag-name"}."""
    return {key: "--" + dest.replace("_", "-") for dest, key in flags.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf",
        description="RLHF end to end: SFT, reward model, PPO / PPO-max / APA / AWR / GRPO / Dr. GRPO / "
        "RLOO / REINFORCE++, evaluation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    _demo_parsers(sub)
    stages = [*_supervised_parsers(sub), _train_parser(sub), _eval_parser(sub), _rm_eval_parser(sub)]
    for stage in stages:  # every command that reads a model directory or a data file
        _add_safety_flags(stage)
        stage.add_argument(
            "--skip-invalid",
            action="store_true",
            default=None,
            help="skip malformed data records (counted and reported) instead of stopping at the first "
            "(same as --data.skip_invalid true)",
        )
    _plan_parser(sub)
    _serve_rm_parser(sub)
    data = sub.add_parser("data", help=STAGES["data"], description=STAGES["data"])
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    check = data_sub.add_parser("check", help="validate a dataset file and print its statistics")
    from rlhf.data.check import add_check_arguments

    add_check_arguments(check)
    _add_safety_flags(check)

    report = sub.add_parser("report", help=STAGES["report"], description=STAGES["report"])
    report.add_argument(
        "directory", help="the --out directory of `rlhf sft`, `rlhf rm`, `rlhf train` or `rlhf demo`"
    )
    _config_parser(sub)
    return parser


def _config_parser(sub) -> None:
    """`rlhf config STAGE`, and the config groups named at the end of each stage's --help."""
    from rlhf.config.listing import help_epilog
    from rlhf.config.stages import STAGE_CONFIGS

    for stage in STAGE_CONFIGS:
        sub.choices[stage].epilog = help_epilog(stage)
    config = sub.add_parser("config", help=STAGES["config"], description=STAGES["config"])
    config.add_argument(
        "config_stage", metavar="STAGE", choices=list(STAGE_CONFIGS), help="the command whose keys to list"
    )
    config.add_argument("--preset", help="rlhf train: show this preset's values (marked *)")


def _demo_parsers(sub) -> None:
    """`rlhf demo` and `rlhf ablate`: the built-in world."""
    demo = sub.add_parser("demo", help=STAGES["demo"], description=STAGES["demo"])
    demo.add_argument("--out", default="runs/demo", help="output directory (report.html, summary.json)")
    demo.add_argument(
        "--compare",
        action="store_true",
        help="run vanilla PPO, PPO-max, APA, AWR, GRPO and RLOO side by side",
    )
    demo.add_argument(
        "--compare-only",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        metavar="NAMES",
        help="--compare with only these runs, comma-separated (e.g. ppo_max,dpo)",
    )
    demo.add_argument("--seeds", type=_positive_int, default=1, help="seeds per algorithm")
    demo.add_argument("--config", help="YAML file of demo settings")

    ablate = sub.add_parser("ablate", help=STAGES["ablate"], description=STAGES["ablate"])
    ablate.add_argument("--preset", default="ppo_max", help="the preset whose tricks are switched")
    ablate.add_argument("--seeds", type=int, default=3, help="seeds per variant (95%% intervals over them)")
    ablate.add_argument("--out", default="runs/ablate", help="output directory (ablation.json, report.html)")
    ablate.add_argument("--jobs", type=int, default=1, help="runs at a time, one process each")
    ablate.add_argument("--kl-budget", type=float, default=2.0, help="KL at which the gold gain is read")
    ablate.add_argument("--add-trick", action="append", default=[], metavar="NAME",
                        help="ablate a later paper's switch too: clip_cov | kl_cov | rollout_correction")  # fmt: skip
    ablate.add_argument("--config", help="YAML file of demo settings (world, model, steps, iterations)")


def _supervised_parsers(sub) -> list:
    """`rlhf sft`, `rlhf rm` and `rlhf dpo`: --model, --data, --out and --config."""
    sft = sub.add_parser("sft", help=STAGES["sft"], description=STAGES["sft"])
    sft.add_argument("--model", help="base model directory (save_pretrained), hub id, or GGUF directory")
    sft.add_argument("--data", help="SFT data file (.jsonl/.json/.parquet)")
    sft.add_argument("--out", help="run directory")
    sft.add_argument("--config", help="YAML config file")

    rm = sub.add_parser("rm", help=STAGES["rm"], description=STAGES["rm"])
    rm.add_argument("--model", help="initialization, usually the SFT run directory")
    rm.add_argument("--data", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat messages)")
    rm.add_argument("--out", help="run directory")
    rm.add_argument("--config", help="YAML config file")

    dpo = sub.add_parser("dpo", help=STAGES["dpo"], description=STAGES["dpo"])
    dpo.add_argument("--model", help="the SFT model: trained, and frozen as the reference")
    dpo.add_argument("--data", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat messages)")
    dpo.add_argument("--out", help="run directory")
    dpo.add_argument("--config", help="YAML config file")
    dpo.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last checkpoint (saved every --checkpoint.every N steps)",
    )
    _add_allow_changed_flag(dpo)
    return [sft, rm, dpo]


def _train_parser(sub) -> argparse.ArgumentParser:
    train = sub.add_parser("train", help=STAGES["train"], description=STAGES["train"])
    train.add_argument(
        "--preset",
        help="vanilla_ppo | ppo_max | apa | awr | grpo | rloo | reinforce_pp | dapo | gspo | cispo",
    )
    train.add_argument("--policy", help="SFT model directory (also the frozen reference)")
    train.add_argument("--reward-model", help="reward-model directory")
    train.add_argument(
        "--reward-fn",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a Python reward function, added to the reward model's score (repeatable; weights: reward.functions)",
    )
    train.add_argument(
        "--reward-url",
        metavar="URL",
        help="a reward server (`rlhf serve-rm`, docs/reward_server.md) instead of --reward-model "
        "(reward.remote.url)",
    )
    train.add_argument(
        "--reward-token-env",
        metavar="NAME",
        help="the environment variable holding the reward server's bearer token (reward.remote.token_env; "
        "the name is recorded, never the token)",
    )
    _add_llm_judge_flags(train, "a score: a reward source beside the others", "reward.llm_judge")
    train.add_argument(
        "--env",
        metavar="MODULE:CLASS",
        help="multi-turn episodes against a Python environment class (docs/environments.md; "
        "--env.max_turns N, --env.max_tokens N)",
    )
    train.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="episodes of your own agent, function(row, base_url, model) -> reward, against an "
        "OpenAI-compatible server over the policy (docs/environments.md; --agent.concurrency N)",
    )
    train.add_argument("--prompts", help="prompts file")
    train.add_argument("--out", help="run directory")
    train.add_argument("--config", help="YAML config file")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint"
    )
    _add_allow_changed_flag(train)
    return train


def _add_llm_judge_flags(parser: argparse.ArgumentParser, asked: str, group: str) -> None:
    """--judge-url/-model/-key-env/-template of train and eval (rlhf/config/llm_judge.py)."""
    parser.add_argument(
        "--judge-url",
        metavar="URL",
        help=f"an LLM judge: an OpenAI-compatible server's base URL (http://HOST:PORT/v1) asked for {asked} "
        f"({group}.url; docs/usage.md#llm-judge)",
    )
    parser.add_argument("--judge-model", metavar="NAME", help=f"the judge server's model ({group}.model)")
    parser.add_argument(
        "--judge-key-env",
        metavar="NAME",
        help=f"the environment variable holding the judge server's API key ({group}.key_env; the name is "
        "recorded, never the key)",
    )
    parser.add_argument(
        "--judge-template",
        metavar="FILE",
        help=f"the judge's prompt template; default built in ({group}.template)",
    )


def _add_allow_changed_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume-allow-changed-models",
        action="store_true",
        help="with --resume: continue although a model file the run reads (policy/reference, reward model) "
        "changed since the run started (refused otherwise; the change is recorded in run_inputs.json)",
    )


def _eval_parser(sub) -> argparse.ArgumentParser:
    ev = sub.add_parser(
        "eval",
        help=STAGES["eval"],
        description=STAGES["eval"] + ". Each flag sets the EvalConfig key it names; any key is also a "
        "dotted override (--rollout.top_p 0.9) or a --config FILE.yaml setting.",
    )
    ev.add_argument("--policy", help="policy directory to evaluate (policy)")
    ev.add_argument(
        "--baseline",
        help="policy directory to compare against; not needed with --reward-fn alone (baseline)",
    )
    ev.add_argument(
        "--judge",
        action="append",
        help="reward-model directory (or 'world:DIR' for a built-in world's gold reward) (judge); "
        "repeated: every judge scores the same answers, each with its own figures (extra_judges)",
    )
    ev.add_argument(
        "--reward-fn",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a Python reward function (repeatable): its mean on the policy's answers with a 95%% interval "
        "(Wilson for a 0/1 verifier: the accuracy), with --baseline the paired difference; added to the "
        "--judge's score (reward_functions)",
    )
    _add_llm_judge_flags(ev, "a verdict on each pair of answers, asked twice in swapped order", "llm_judge")
    ev.add_argument("--prompts", help="held-out prompts file (data.prompts)")
    ev.add_argument(
        "--pairs",
        help="held-out preference pairs: the share where the policy raised the chosen response's "
        "log-ratio to --baseline above the rejected one's, eval.json's \"pairs\"; needs no judge "
        "(data.pairs; docs/algorithms.md §38)",
    )
    ev.add_argument("--pairs-n", type=_scalar, help="the first N valid pairs; default all (data.pairs_n)")
    ev.add_argument("--out", help="write eval.json here (default: beside the policy) (out)")
    ev.add_argument(
        "--n",
        type=_scalar,
        help="prompts to evaluate, the first N, N >= 1 (as in `rlhf rm-eval`); 256 (data.n)",
    )
    ev.add_argument("--max-new-tokens", type=_scalar, help="response budget; 64 (rollout.max_new_tokens)")
    ev.add_argument(
        "--max-prompt-tokens",
        type=_scalar,
        help="prompt budget in tokens, oldest dialogue turns dropped first (default: the --policy run's "
        "data.max_prompt_tokens from its config.yaml, else 512) (data.max_prompt_tokens)",
    )
    ev.add_argument(
        "--temperature", type=_scalar, help="sampling temperature; 0: greedy; 1.0 (rollout.temperature)"
    )
    ev.add_argument("--top-p", type=_scalar, help="nucleus sampling; 1.0 (rollout.top_p)")
    ev.add_argument(
        "--sampling",
        type=_scalar,
        help="custom | paper: the PPO paper §6.1 sampling (temperature 0.8, top-p 0.9, repetition penalty "
        "1.1) instead of --temperature/--top-p (rollout.sampling)",
    )
    ev.add_argument("--seed", type=_scalar, help="sampling seed; 0 (seed)")
    _add_device_flags(ev)
    ev.add_argument(
        "--chat-template",
        type=_scalar,
        help="auto | true | false: render HH dialogues and messages with the policy tokenizer's chat "
        "template and stop at its end-of-turn token (auto: when it has one) (data.chat_template)",
    )
    ev.add_argument("--config", help="YAML file of EvalConfig settings")
    return ev


def _rm_eval_parser(sub) -> argparse.ArgumentParser:
    rm_eval = sub.add_parser(
        "rm-eval",
        help=STAGES["rm-eval"],
        description=STAGES["rm-eval"] + ". Each flag sets the RMEvalConfig key it names; any key is also a "
        "dotted override (--data.max_prompt_tokens 512) or a --config FILE.yaml setting.",
    )
    rm_eval.add_argument("--reward-model", help="reward-model directory, `rlhf rm --out` (reward_model)")
    rm_eval.add_argument(
        "--data", help="preference pairs (prompt/chosen/rejected, HH-RLHF, chat) (data.path)"
    )
    rm_eval.add_argument("--out", help="write rm_eval.json here (default: in the reward-model directory)")
    rm_eval.add_argument(
        "--n",
        type=_scalar,
        help="score only the first N valid pairs, N >= 1 (as in `rlhf eval`); no --n: every pair (n)",
    )
    rm_eval.add_argument("--batch-size", type=_scalar, help="pairs per forward; 8 (batch_size)")
    rm_eval.add_argument("--worst", type=_scalar, help="worst pairs (most negative margin) to keep; 10")
    rm_eval.add_argument("--calibration-bins", type=_scalar, help="bins of sigmoid(|margin|); 10")
    rm_eval.add_argument("--histogram-bins", type=_scalar, help="margin histogram bins (even); 10")
    _add_device_flags(rm_eval)
    rm_eval.add_argument("--config", help="YAML file of RMEvalConfig settings")
    return rm_eval


def _serve_rm_parser(sub) -> None:
    serve = sub.add_parser("serve-rm", help=STAGES["serve-rm"], description=STAGES["serve-rm"])
    serve.add_argument("--reward-model", help="reward-model directory, `rlhf rm --out`")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0: every interface")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on; 0: a free one (printed)")
    serve.add_argument("--batch-size", type=int, default=16, help="rows per forward of the reward model")
    serve.add_argument(
        "--max-batch-rows", type=int, default=256, help="rows of waiting requests scored together at most"
    )
    serve.add_argument(
        "--token-env",
        metavar="NAME",
        help="the environment variable holding the bearer token every request must send; off loopback, "
        "without it, a token is made and printed at start",
    )
    serve.add_argument(
        "--max-body-mb", type=float, default=64, help="request bodies larger than this are refused (HTTP 413)"
    )
    serve.add_argument("--device", default="auto", help="auto (CUDA when available, else CPU) | cpu | cuda:N")
    serve.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | bfloat16-pure")
    _add_safety_flags(serve)


def _plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help=STAGES["plan"], description=STAGES["plan"] + " (docs/scale.md)")
    plan.add_argument("--model", required=True, help="a named shape (0.5b 1.5b 7b 13b 70b smollm2-135m m84), "
                      "or a model directory / config.json")  # fmt: skip
    plan.add_argument(
        "--preset",
        default="ppo_max",
        help="an rlhf train preset (its roles: a critic, separate or shared, or none), or sft | rm | dpo | simpo "
        "(rlhf dpo --dpo.loss simpo: no reference)",
    )
    plan.add_argument("--lora", action="store_true", help="train LoRA adapters (the reference: adapter off)")
    plan.add_argument("--lora-rank", type=_positive_int, default=16)
    plan.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | bfloat16-pure")
    plan.add_argument(
        "--strategy",
        default="fsdp2",
        help="none | ddp | fsdp2 (every role sharded per layer)",
    )
    plan.add_argument("--nodes", type=_positive_int, default=1)
    plan.add_argument("--gpus", type=_positive_int, default=8, help="GPUs (ranks) per node")
    plan.add_argument(
        "--gpu-memory", type=_memory_size, default="80GB", help="memory of one GPU with its unit: 80GB, 24GiB"
    )
    plan.add_argument("--micro-batch", type=_positive_int, default=2, help="rows per update forward/backward")
    plan.add_argument(
        "--rollout-batch", type=_positive_int, help="responses per rollout (default: the preset's)"
    )
    plan.add_argument("--prompt-tokens", type=_positive_int, default=512)
    plan.add_argument("--response-tokens", type=_positive_int, default=512)
    plan.add_argument("--gradient-checkpointing", action="store_true")
    plan.add_argument("--offload", action="store_true", help="fsdp2: shards and AdamW state in CPU memory")
    plan.add_argument(
        "--overlap-critic",
        action="store_true",
        help="one process on a CPU: policy and critic steps side by side (runtime.overlap_critic)",
    )
    plan.add_argument(
        "--rollout-gather", default="whole", help="fsdp2 sampling: whole | per_layer (dist.rollout_gather)"
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def _add_safety_flags(parser: argparse.ArgumentParser) -> None:
    from rlhf.models.trust import PICKLE_FLAG, TRUST_FLAG

    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="let transformers run the Python files of a model directory (auto_map); off: refused",
    )
    parser.add_argument(
        PICKLE_FLAG,
        action="store_true",
        help="read pickle weights (pytorch_model.bin) when a directory has no safetensors; off: refused",
    )


def _overrides(rest: list[str], named: dict[str, str | None], flags: dict[str, str] | None = None) -> dict:
    """The dotted overrides of `rest` with the named flags' values (`named`: dotted key -> value) under
    them. A named flag and its dotted key given with two values is one setting said twice: refused,
    naming both (`flags`: dotted key -> the named flag's spelling, for the message)."""
    from rlhf.config import ConfigError, deep_merge, parse_overrides

    overrides = parse_overrides(rest)
    for dotted, value in named.items():
        if value is None:
            continue
        node = overrides
        for part in dotted.split("."):
            node = node.get(part, _UNSET) if isinstance(node, dict) else _UNSET
        if node is not _UNSET and node != value and not isinstance(node, dict):
            flag = (flags or {}).get(dotted) or "--" + dotted.split(".")[-1].replace("_", "-")
            raise ConfigError(
                f"command line: {flag} {value!r} and --{dotted} {node!r} are one setting ({flag} sets "
                f"{dotted}) given two values. Fix: give only one of them."
            )
        node: dict = {}
        top = node
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        overrides = deep_merge(top, overrides)  # explicit dotted flags win over named ones
    return overrides


_UNSET = object()


def _run_supervised_stage(args, rest, config_class, run, ctx) -> int:
    """`rlhf sft`, `rlhf rm` and `rlhf dpo`: --model, --data and --out over --config and dotted overrides."""
    from rlhf.config import load_config
    from rlhf.parallel.process_group import agreed_on_rank0, data_parallel
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import writer_lock

    named = {
        "model": args.model,
        "data.path": args.data,
        "out": args.out,
        "data.skip_invalid": args.skip_invalid,
    }
    if getattr(args, "resume", None):  # `rlhf dpo --resume RUN_DIR`
        from rlhf.rundir.supervised_resume import supervised_resume_config

        config = supervised_resume_config(
            config_class,
            args.resume,
            stage=ctx.stage,
            file=args.config,
            overrides=_overrides(rest, named, SUPERVISED_FLAGS),
        )
        preflight(config)
        allow = args.resume_allow_changed_models
        with data_parallel(config.dist, config.train.device), writer_lock(config.out) as ctx.run_dir:

            def check() -> None:
                _prepare_resume(ctx.run_dir)
                _check_resumed_models(config, ctx.run_dir, allow, command=f"rlhf {ctx.stage}")

            agreed_on_rank0(check)  # every rank stops if rank 0 refuses
            run(config, resume=True)
        return 0
    _refuse_allow_changed_without_resume(args)
    config = load_config(config_class, file=args.config, overrides=_overrides(rest, named, SUPERVISED_FLAGS))
    _require(config.model, "--model")
    _require(config.data.path, "--data")
    if ctx.stage in ("sft", "dpo"):  # a reward model's trunk has no trained LM head
        _refuse_reward_model_as_policy(config.model, "--model", ctx.stage)
    preflight(config)
    check_out_dir(config.out, {"--model": config.model})
    with data_parallel(config.dist, config.train.device):
        # rank 0 alone reads --out (another rank could see the files rank 0 starts writing)
        agreed_on_rank0(lambda: check_fresh_out(config.out, ctx.stage, args.config))
        with writer_lock(config.out) as ctx.run_dir:
            from rlhf.rundir.run_inputs import model_inputs, record_models

            # the model files it starts from, before they are read: a resume checks them (as train's)
            agreed_on_rank0(lambda: record_models(config.out, model_inputs(config)))
            run(config)
    return 0


def _refuse_allow_changed_without_resume(args) -> None:
    if getattr(args, "resume_allow_changed_models", False):
        from rlhf.config import ConfigError

        raise ConfigError(
            "--resume-allow-changed-models applies to `--resume RUN_DIR` only; a new run records "
            "the models it starts from. Fix: drop --resume-allow-changed-models, or add --resume RUN_DIR."
        )


def run_sft_command(args, rest, ctx) -> int:
    from rlhf.config import SFTConfig
    from rlhf.stages.sft import run_sft

    return _run_supervised_stage(args, rest, SFTConfig, run_sft, ctx)


def run_rm_command(args, rest, ctx) -> int:
    from rlhf.config import RewardConfig
    from rlhf.stages.rm import run_reward_training

    return _run_supervised_stage(args, rest, RewardConfig, run_reward_training, ctx)


def run_dpo_command(args, rest, ctx) -> int:
    from rlhf.config import DPOConfig
    from rlhf.stages.dpo import run_dpo

    return _run_supervised_stage(args, rest, DPOConfig, run_dpo, ctx)


def run_train_command(args, rest, ctx) -> int:
    from rlhf.config import RLConfig, load_config
    from rlhf.parallel.process_group import agreed_on_rank0, data_parallel
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import writer_lock
    from rlhf.stages.train import run_rl

    named = {
        "model.policy": args.policy,
        "model.reward_model": args.reward_model,
        "reward.remote.url": args.reward_url,
        "reward.remote.token_env": args.reward_token_env,
        "reward.llm_judge.url": args.judge_url,
        "reward.llm_judge.model": args.judge_model,
        "reward.llm_judge.key_env": args.judge_key_env,
        "reward.llm_judge.template": args.judge_template,
        "data.prompts": args.prompts,
        "env.name": args.env,
        "agent.name": args.agent,
        "out": args.out,
        "data.skip_invalid": args.skip_invalid,
    }
    ctx.resumable = True
    if args.resume:
        from rlhf.rundir.resume import resume_config
        from rlhf.rundir.run_inputs import check_config_unedited

        check_config_unedited(args.resume)  # a hand-edited config.yaml would lie about the run
        config = resume_config(
            args.resume, preset=args.preset, file=args.config, overrides=_overrides(rest, named, TRAIN_FLAGS)
        )
        preflight(config)
        _fit_ray(config, args.config, rest)
        with data_parallel(config.dist, config.train.device), writer_lock(config.out) as ctx.run_dir:
            # rank 0 checks (and tidies) the run directory; every rank stops if it refuses
            agreed_on_rank0(lambda: _check_resume(config, ctx.run_dir, args.resume_allow_changed_models))
            run_rl(config, resume=True)
        return 0
    _refuse_allow_changed_without_resume(args)
    config = load_config(
        RLConfig, preset=args.preset, file=args.config, overrides=_overrides(rest, named, TRAIN_FLAGS)
    )
    config.reward.functions = [*config.reward.functions, *(args.reward_fn or [])]  # weight 1 each
    _require(config.model.policy, "--policy")
    _require(
        config.model.reward_model
        or config.reward.remote.url
        or config.reward.llm_judge.url
        or config.reward.functions
        or config.env.name
        or config.agent.name,
        "--reward-model (or --reward-url, --judge-url, --reward-fn, --env or --agent)",
    )
    _require(config.data.prompts, "--prompts")
    _refuse_reward_model_as_policy(config.model.policy)
    preflight(config)
    _fit_ray(config, args.config, rest)
    check_out_dir(config.out, {"--policy": config.model.policy, "--reward-model": config.model.reward_model})
    with data_parallel(config.dist, config.train.device):
        agreed_on_rank0(lambda: check_fresh_out(config.out, "train", args.config))  # rank 0 reads --out
        with writer_lock(config.out) as ctx.run_dir:
            run_rl(config)
    return 0


def check_fresh_out(out: str, stage: str, config_file: str | None) -> None:
    """A fresh run's --out: no earlier run's metrics (resume or another --out), nothing of the user's."""
    from rlhf.rundir.directory import check_fresh_run_dir
    from rlhf.rundir.lock import refuse_if_in_use
    from rlhf.rundir.outputs import check_out_holds_nothing_of_yours

    refuse_if_in_use(out)  # a run writing there now is said first
    check_out_holds_nothing_of_yours(out, stage, config_file)  # another stage's run, a model, your files
    check_fresh_run_dir(out, resumable=stage in ("train", *RESUMABLE_SUPERVISED))


def _refuse_reward_model_as_policy(policy: str, flag: str = "--policy", stage: str = "train") -> None:
    from rlhf.config import ConfigError
    from rlhf.models.scalar_head import HEAD_WEIGHTS_NAME

    if (Path(policy) / HEAD_WEIGHTS_NAME).is_file():
        also = ", and this one as --reward-model" if stage == "train" else ""
        raise ConfigError(
            f"{flag} {policy} is a reward-model directory (it holds {HEAD_WEIGHTS_NAME}); `rlhf {stage}` "
            f"trains a causal LM (its language-model head). Fix: pass "
            f"{'a base causal LM (a save_pretrained directory or hub id)' if stage == 'sft' else 'the --out directory of `rlhf sft`'} "
            f"as {flag}{also}."
        )


def _check_resume(config, run_dir, allow_changed: bool) -> None:
    _prepare_resume(run_dir)
    _check_resumed_models(config, run_dir, allow_changed)


def _prepare_resume(run_dir) -> None:
    """Remove what killed checkpoint writes left, and set damaged newest checkpoints aside (warning
    about each) so the run resumes from the newest complete one."""
    from rlhf.config import ConfigError
    from rlhf.rundir import checkpoint as ckpt

    ckpt.clean_stale(run_dir)
    problems: list[str] = []

    def warn(message: str) -> None:
        problems.append(message)
        print(f"warning: {message}", file=sys.stderr)

    if ckpt.set_aside_damaged(run_dir, warn) is None:
        found = "; ".join(problems) or "there is no checkpoints/iter_* directory"
        raise ConfigError(
            f"{run_dir} has no complete checkpoint to resume from ({found}). Fix: start a fresh run with "
            "another --out (add --checkpoint.every N to save during the run)."
        )


def _check_resumed_models(config, run_dir, allow_changed: bool, command: str = "rlhf train") -> None:
    """The models of a resumed run are the files it started from (run_inputs.json), or the user
    accepted the change."""
    from rlhf.rundir import checkpoint as ckpt
    from rlhf.rundir.run_inputs import check_models

    latest = ckpt.latest_verified(run_dir, warn=lambda message: None)
    iteration = None if latest is None else int(latest.name.split("_")[1])
    check_models(
        config,
        run_dir,
        allow_changed=allow_changed,
        iteration=iteration,
        warn=lambda message: print(message, file=sys.stderr),
        command=command,
    )


def eval_config(args, rest: list[str]):
    """The validated EvalConfig of `rlhf eval ARGS`: --config < named flags < dotted overrides."""
    from rlhf.config import EvalConfig, load_config

    named = {key: getattr(args, dest) for dest, key in EVAL_FLAGS.items()}
    judges = named.pop("judge") or []  # --judge A --judge B: A is `judge`, B on `extra_judges`
    named["judge"] = judges[0] if judges else None
    named["extra_judges"] = judges[1:] or None
    return load_config(
        EvalConfig, file=args.config, overrides=_overrides(rest, named, _flag_names(EVAL_FLAGS))
    )


def rm_eval_config(args, rest: list[str]):
    """The validated RMEvalConfig of `rlhf rm-eval ARGS` (the reward model's budgets under them)."""
    from rlhf.stages.rm_eval import rm_eval_config as build

    named = {key: getattr(args, dest) for dest, key in RM_EVAL_FLAGS.items()}
    return build(file=args.config, overrides=_overrides(rest, named, _flag_names(RM_EVAL_FLAGS)))


def run_eval_command(args, rest, ctx) -> int:
    from rlhf.stages.eval import run_eval

    config = eval_config(args, rest)
    preflight(config)
    run_eval(config)
    return 0


def run_rm_eval_command(args, rest, ctx) -> int:
    from rlhf.stages.rm_eval import run_rm_eval

    config = rm_eval_config(args, rest)
    preflight(config)
    run_rm_eval(config)
    return 0


def run_demo_command(args, rest, ctx) -> int:
    from rlhf.demo.run import run_demo
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import refuse_if_in_use, run_dir_lock
    from rlhf.rundir.outputs import DEMO_OUTPUTS, check_out_holds_nothing_of_yours

    # the demo clears its earlier outputs: never a folder of anything else
    check_out_dir(args.out, {})  # an existing file, a read-only or impossible path
    refuse_if_in_use(args.out)
    check_out_holds_nothing_of_yours(args.out, "demo", args.config, leftovers=DEMO_OUTPUTS)
    with run_dir_lock(args.out) as ctx.run_dir:
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
    from rlhf.rundir.directory import check_out_dir
    from rlhf.rundir.lock import refuse_if_in_use, run_dir_lock
    from rlhf.rundir.outputs import ABLATE_OUTPUTS, check_out_holds_nothing_of_yours

    # the ablation resumes from its own outputs and clears them: never a folder of anything else
    check_out_dir(args.out, {})  # an existing file, a read-only or impossible path
    refuse_if_in_use(args.out)
    check_out_holds_nothing_of_yours(
        args.out, "ablate", args.config, leftovers=ABLATE_OUTPUTS, every_output=True
    )
    with run_dir_lock(args.out) as ctx.run_dir:
        return run_ablation(
            out=args.out,
            preset=args.preset,
            seeds=args.seeds,
            jobs=args.jobs,
            kl_budget=args.kl_budget,
            config_file=args.config,
            overrides=rest,
            extra_tricks=tuple(args.add_trick),
        )


def run_serve_rm_command(args, rest, ctx) -> int:
    from rlhf.stages.serve_rm import run_serve_rm

    if rest:
        raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf serve-rm --help`.")
    return run_serve_rm(args)


def run_plan_command(args, rest, ctx) -> int:
    import json

    from rlhf.config import ConfigError, RLConfig, load_config
    from rlhf.planner.memory_plan import STAGES, Job, parse_bytes, plan, render, shape_of

    if rest:
        raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf plan --help`.")
    stage = args.preset if args.preset in STAGES[1:] else "rl"  # sft | rm | dpo | simpo: a supervised stage
    preset = load_config(RLConfig, preset="ppo_max" if stage != "rl" else args.preset)
    critic = preset.model.critic_mode if preset.uses_critic and stage == "rl" else "none"
    try:
        job = Job(
            shape=shape_of(args.model),
            stage=stage,
            critic=critic,
            lora=args.lora,
            lora_rank=args.lora_rank,
            dtype=args.dtype,
            strategy=args.strategy,
            ranks=args.nodes * args.gpus,
            micro_batch=args.micro_batch,
            rollout_rows=args.rollout_batch or preset.rollout.batch_size,
            prompt_tokens=args.prompt_tokens,
            response_tokens=args.response_tokens,
            gradient_checkpointing=args.gradient_checkpointing,
            rollout_gather=args.rollout_gather,
            offload=args.offload,
            overlap_critic=args.overlap_critic,
            gpu_memory=parse_bytes(args.gpu_memory),
        )
        result = plan(job)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(json.dumps(result.as_json(), indent=2) if args.json else render(result))
    return 0


def run_config_command(args, rest, ctx) -> int:
    from rlhf.config.listing import render

    if rest:
        raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf config --help`.")
    print(render(args.config_stage, args.preset))
    return 0


def run_report_command(args, rest, ctx) -> int:
    from rlhf.report_command import run_report

    if rest:
        raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf report --help`.")
    return run_report(args.directory)


def preflight(config) -> None:
    """The checks of rlhf/preflight.py: optional packages, input file kinds, world judges, a Ray address."""
    from rlhf.preflight import preflight as check

    check(config)


def _fit_ray(config, file: str | None, rest: list[str]) -> None:
    """Ray started here: the roles' default CPU reservations scaled to this machine (said on stderr);
    the values a --config file or a flag set are kept (and refused when they cannot fit)."""
    from rlhf.config import parse_overrides, read_yaml
    from rlhf.preflight import fit_ray_to_machine
    from rlhf.rundir.resume import flatten_keys

    explicit = set(flatten_keys(parse_overrides(rest)))
    if file:
        explicit |= set(flatten_keys(read_yaml(file)))
    said = fit_ray_to_machine(config, explicit)
    if said:
        print(said, file=sys.stderr)


def _require(value, flag: str) -> None:
    if not value:
        from rlhf.config import ConfigError

        raise ConfigError(f"missing {flag}. Fix: pass {flag} (or set it in --config).")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.stage is None:
        parser.print_help()
        return 0
    from transformers.utils import logging as hf_logging

    from rlhf.models.trust import set_load_policy
    from rlhf.parallel.threads import limit_threads

    hf_logging.disable_progress_bar()  # our own progress display replaces transformers' load/save bars
    limit_threads()  # OMP_NUM_THREADS, else the cores this process may use (affinity, cgroup quota)
    set_load_policy(
        trust_remote_code=getattr(args, "trust_remote_code", False),
        allow_pickle=getattr(args, "allow_pickle", False),
    )
    try:
        return _run_with_one_error_path(parser, args, rest)
    finally:
        set_load_policy()  # the flags hold for this command only (main() may be called in-process)


def _run_with_one_error_path(parser, args, rest) -> int:
    """Run the stage; every failure ends as one message on stderr and an exit code (cli_errors.py)."""
    from rlhf import cli_errors
    from rlhf.parallel.process_group import is_lost_peer, lost_peer_message
    from rlhf.rundir.termination import Terminated, handle_sigterm

    ctx = cli_errors.RunContext(stage=args.stage)
    try:
        with handle_sigterm():  # SIGTERM (a scheduler's preemption) ends the run as Ctrl-C does
            return _dispatch(parser, args, rest, ctx)
    except Terminated:
        how = "terminated (SIGTERM)"
        message = _resumable_supervised_interrupt(ctx, how) or cli_errors.interrupted_message(ctx, how)
        code = cli_errors.TERMINATED
    except KeyboardInterrupt:
        message = _resumable_supervised_interrupt(ctx) or cli_errors.interrupted_message(ctx)
        code = cli_errors.INTERRUPTED
    except BrokenPipeError:  # the reader of our output closed it (`rlhf plan | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            raise  # argparse's own exits (--help, usage errors) keep their code
        message, code = str(stop.code), cli_errors.USER_ERROR
    except Exception as err:  # noqa: BLE001 (the one place that turns every failure into a message)
        if cli_errors.is_user_error(err):
            message, code = str(err), cli_errors.USER_ERROR
        elif is_lost_peer(err):  # torchrun: another rank died or hung; its own message names it
            message, code = (
                lost_peer_message(err, ctx.run_dir if ctx.resumable else None),
                cli_errors.INTERNAL_ERROR,
            )
        elif cli_errors.is_no_space(err):
            message, code = cli_errors.no_space_message(ctx, err), cli_errors.USER_ERROR
        else:
            message, code = cli_errors.internal_error_message(ctx, err), cli_errors.INTERNAL_ERROR
    from rlhf.parallel.process_group import rank_label

    # one write: the ranks of a torchrun job share stderr, and print's separate newline could land
    # inside another rank's message
    sys.stderr.write(f"rlhf {args.stage}{rank_label()}: {message}\n")
    sys.stderr.flush()
    return code


RESUMABLE_SUPERVISED = ("dpo",)  # supervised stages with --resume (checkpoint.every)


def _resumable_supervised_interrupt(ctx, how: str = "interrupted") -> str | None:
    """Ctrl-C (or SIGTERM) in `rlhf dpo` after a checkpoint: the command that continues the run (None
    otherwise: cli_errors' message, which says the run cannot resume)."""
    if ctx.stage not in RESUMABLE_SUPERVISED or ctx.run_dir is None:
        return None
    from rlhf.rundir.checkpoint import latest_verified

    found = latest_verified(ctx.run_dir, warn=lambda message: None)
    if found is None:
        return None
    steps = int(found.name.split("_")[1])
    return (
        f"{how}; the newest checkpoint holds the first {steps} steps. Resume with: "
        f"rlhf {ctx.stage} --resume {ctx.run_dir}"
    )


def _dispatch(parser, args, rest, ctx) -> int:
    _refuse_data_parallel_launch(args.stage)
    if args.stage == "data":
        if args.data_command != "check":
            parser.parse_args(["data", "--help"])
        if rest:
            raise SystemExit(f"unexpected arguments {rest}. Fix: see `rlhf data check --help`.")
        from rlhf.data.check import run_check
        from rlhf.preflight import check_input_file

        check_input_file(args.file, "FILE")
        return run_check(args)
    handler = {
        "sft": run_sft_command,
        "dpo": run_dpo_command,
        "rm": run_rm_command,
        "train": run_train_command,
        "eval": run_eval_command,
        "rm-eval": run_rm_eval_command,
        "demo": run_demo_command,
        "ablate": run_ablate_command,
        "report": run_report_command,
        "plan": run_plan_command,
        "serve-rm": run_serve_rm_command,
        "config": run_config_command,
    }[args.stage]
    return handler(args, rest, ctx)


def _refuse_data_parallel_launch(stage: str) -> None:
    """Only sft, rm and train run data-parallel; under torchrun with several processes the other
    stages would each run whole and write the same files."""
    from rlhf.parallel.process_group import launch_world_size

    if stage not in ("sft", "rm", "dpo", "train") and launch_world_size() > 1:
        from rlhf.config import ConfigError

        raise ConfigError(
            f"rlhf {stage} runs in one process, but torchrun started {launch_world_size()}. "
            f"Fix: run `rlhf {stage} ...` (or `python -m rlhf {stage} ...`) without torchrun."
        )


if __name__ == "__main__":
    sys.exit(main())
