"""The sampler/trainer log-prob gap (`mismatch/*`, rlhf/rl/mismatch.py) of one rollout per precision:
the sampler's KV-cached decode against the trainer's full forward of the same policy, same tokens.

    .venv/bin/python -m bench.studies.mismatch                          # a tiny random Llama (seconds)
    .venv/bin/python -m bench.studies.mismatch --policy DIR --rows 16 --max-new-tokens 48
        # DIR: a causal LM (save_pretrained), e.g. SmolLM2-135M-Instruct (bench/speed/smollm2.py convert)

Prints one JSON line per precision (float32, bfloat16 autocast, bfloat16-pure weights) with the
three numbers; docs/monitors.md#sampler-trainer-mismatch keeps the measured ones.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time

PRECISIONS = ("float32", "bfloat16", "bfloat16-pure")
WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


def zero(prompts, responses, **_):
    """The reward function of these runs: the rollout's scores do not enter the gap."""
    return [0.0] * len(responses)


def policy_and_prompts(policy: str | None, rows: int):
    """(tokenizer, causal LM, prompt ids): DIR's model and chat prompts, or a tiny random Llama."""
    from rlhf.models.loading import load_causal_lm, load_tokenizer, prepare_tokenizer

    if policy is None:
        from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

        tokenizer = word_tokenizer([" ".join(WORDS)])
        model = tiny_causal_lm(tokenizer, seed=0, hidden_size=64, num_layers=2, num_heads=4)
        texts = [" ".join(WORDS[i % 17 : i % 17 + 3]) for i in range(rows)]
        return tokenizer, model, [tokenizer(t)["input_ids"] for t in texts]
    from bench.speed.smollm2 import chat_prompts

    tokenizer = prepare_tokenizer(load_tokenizer(policy), source=policy)
    return tokenizer, load_causal_lm(policy), chat_prompts(tokenizer, rows)


def measure(policy: str | None, rows: int, max_new_tokens: int, seed: int, precision: str) -> dict:
    from rlhf.config import RLConfig, load_config
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    tokenizer, model, prompts = policy_and_prompts(policy, rows)
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            RLConfig,
            preset="grpo",
            overrides={
                "seed": seed, "dtype": precision, "out": run_dir,
                "rollout": {"batch_size": rows // 2, "samples_per_prompt": 2, "max_new_tokens": max_new_tokens},
                "reward": {"functions": ["bench.studies.mismatch:zero"]},
                "train": {"micro_batch_size": 8, "iterations": 1},
                "log": {"sinks": ["jsonl"], "mismatch": {"kl_threshold": None}},
            },
        )  # fmt: skip
        roles = assemble_roles(config, tokenizer=tokenizer, policy=copy.deepcopy(model), reward_model=None)
        trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), prompts, run_dir=run_dir, quiet=True)
        started = time.perf_counter()
        experience, metrics = trainer.make_experience()
        trainer.logger.close()
    return {
        "precision": precision,
        "policy": policy or "tiny random Llama (hidden 64, 2 layers)",
        "tokens": int(experience.num_tokens),
        **{k: metrics[k] for k in ("mismatch/kl", "mismatch/max_ratio", "mismatch/mean_abs_diff")},
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", help="a causal LM directory; default: a tiny random Llama")
    parser.add_argument("--rows", type=int, default=16, help="responses in the rollout (even)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    args = parser.parse_args()
    for precision in args.precisions.split(","):
        print(
            json.dumps(measure(args.policy, args.rows, args.max_new_tokens, args.seed, precision)), flush=True
        )


if __name__ == "__main__":
    main()
