"""Tiny models and word-level tokenizers built on the fly (tests, the built-in world, benchmarks).

Nothing here downloads anything: a tokenizer is trained from a list of texts with `tokenizers`,
a model is a randomly initialized Llama-architecture `AutoModelForCausalLM` from a `LlamaConfig`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")


def word_tokenizer(texts: Iterable[str], *, add_bos: bool = False) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over every word in `texts`, with <pad>, <unk>, <bos>, <eos>.

    The pad token is distinct from EOS. No padding side is assumed: code that pads sets it.
    """
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(
        vocab_size=1_000_000, min_frequency=1, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    if add_bos:
        from tokenizers import processors

        bos_id = tok.token_to_id("<bos>")
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=1024,
    )


def tiny_llama_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 256,
    pad_token_id: int | None = 0,
    bos_token_id: int | None = 2,
    eos_token_id: int | None = 3,
    tie_word_embeddings: bool = False,
) -> LlamaConfig:
    """A small Llama config (the TRL peer benchmark's "tiny" is the default shape)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )


def tiny_causal_lm(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **config_kwargs) -> torch.nn.Module:
    """A randomly initialized float32 Llama causal LM sized for `tokenizer`, in eval mode."""
    config = tiny_llama_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()
