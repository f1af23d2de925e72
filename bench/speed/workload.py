"""The PPO workload shared with the TRL peer script (../shared/bench/peer/trl_ppo_bench.py).

Same shapes as its `build_tokenizer` / `build_models` / `build_dataset`: a word-level vocabulary
of `vocab` entries (4 specials included), random-init Llama models of the `SIZES` shapes, prompts
of 8-16 random words without BOS, left-padded to the longest prompt of the batch. The words
themselves differ (only shapes matter for speed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

# hidden, layers, heads, intermediate, vocab: the peer script's SIZES
SIZES = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, vocab=1000),
    "small": dict(hidden_size=256, num_layers=4, num_heads=8, intermediate_size=1024, vocab=4000),
}
SPECIALS = 4  # <pad> <unk> <bos> <eos>
PROMPT_WORDS = (8, 16)  # words (= tokens) per prompt, inclusive
NUM_PROMPTS = 256  # size of the prompt pool (the peer's --num-prompts)


@dataclass(frozen=True)
class Workload:
    """One cell of the comparison: model size, rollout shape and update schedule."""

    size: str  # "tiny" | "small"
    ppo_epochs: int
    minibatches: int
    batch_size: int = 16  # B prompts per iteration
    response_length: int = 32  # L sampled tokens per prompt, no EOS stop
    temperature: float = 0.7

    @property
    def name(self) -> str:
        return f"{self.size}-{self.ppo_epochs}x{self.minibatches}"


WORKLOADS = (
    Workload("tiny", 1, 1),
    Workload("tiny", 4, 4),
    Workload("small", 1, 1),
    Workload("small", 4, 4),
)


def pseudo_words(count: int, rng: random.Random) -> list[str]:
    """`count` distinct lowercase consonant-vowel words."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def build_tokenizer(vocab: int, rng: random.Random):
    """A word-level tokenizer of exactly `vocab` entries, and its (non-special) words."""
    from rlhf.models.tiny import word_tokenizer

    words = pseudo_words(vocab - SPECIALS, rng)
    tokenizer = word_tokenizer([" ".join(words[i : i + 20]) for i in range(0, len(words), 20)])
    if len(tokenizer) != vocab:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} entries, expected {vocab}")
    return tokenizer, words


def build_prompts(
    tokenizer, words: list[str], rng: random.Random, count: int = NUM_PROMPTS
) -> list[list[int]]:
    """`count` prompts of PROMPT_WORDS random words, as token-id lists (one token per word, no BOS)."""
    lo, hi = PROMPT_WORDS
    prompts = []
    for _ in range(count):
        text = " ".join(rng.choices(words, k=rng.randint(lo, hi)))
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not all(lo <= len(p) <= hi for p in prompts):
        raise RuntimeError("the tokenizer did not map each word to one token")
    return prompts


def build_causal_lm(size: str, tokenizer, seed: int) -> torch.nn.Module:
    """A random-init float32 Llama causal LM of shape `SIZES[size]` (the peer's LlamaConfig)."""
    from transformers import AutoModelForCausalLM

    from rlhf.models.tiny import tiny_llama_config

    shape = SIZES[size]
    config = tiny_llama_config(
        len(tokenizer),
        hidden_size=shape["hidden_size"],
        num_layers=shape["num_layers"],
        num_heads=shape["num_heads"],
        intermediate_size=shape["intermediate_size"],
        max_positions=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
