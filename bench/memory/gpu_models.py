"""Writes a policy, a reward model and a prompts file of one bench/memory/gpu_memory.py shape to a
directory, as `rlhf train` reads them (save_pretrained directories with their tokenizer), so the
CLI path (torchrun, loading, export) runs on a GPU machine without downloading anything.

    python -m bench.memory.gpu_models --workload m84 --out /tmp/m84    # policy/ rm/ prompts.jsonl sft.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from bench.memory.gpu_memory import SHAPES, causal_lm


def write(name: str, out: Path, seed: int = 0) -> None:
    from bench.speed.workload import build_tokenizer
    from rlhf.models.scalar_head import ScalarHeadModel

    rng = random.Random(seed)
    tokenizer, words = build_tokenizer(SHAPES[name]["vocab"], rng)
    policy = causal_lm(name, tokenizer, seed)
    policy.save_pretrained(out / "policy")
    tokenizer.save_pretrained(out / "policy")
    reward_model = ScalarHeadModel.from_causal_lm(causal_lm(name, tokenizer, seed + 2))
    reward_model.save_pretrained(out / "rm")
    tokenizer.save_pretrained(out / "rm")
    with open(out / "prompts.jsonl", "w") as f:
        for _ in range(64):
            f.write(json.dumps({"prompt": " ".join(rng.choices(words, k=rng.randint(8, 16)))}) + "\n")
    with open(out / "sft.jsonl", "w") as f:  # `rlhf sft`'s rows (bench/memory/dist_memory.py --stage sft)
        for _ in range(64):
            prompt, response = (" ".join(rng.choices(words, k=rng.randint(8, 16))) for _ in range(2))
            f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(SHAPES), default="m84")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write(args.workload, args.out)
    print(f"wrote {args.out}/policy, {args.out}/rm, {args.out}/prompts.jsonl, {args.out}/sft.jsonl")


if __name__ == "__main__":
    main()
