"""A tiny Llama GGUF file written with the `gguf` package's writer (tests.support.gguf_testing).

The file holds what a llama.cpp export holds: the Llama hyper-parameters, a byte-level BPE
tokenizer (the 256 byte symbols, three control tokens and two merges) and the weights, the 2-D
ones quantized (Q4_1 by default: rows of 32 values share a scale and a minimum).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip(
    "gguf",
    reason="the `gguf` package is not installed (it comes with the dev extra: pip install -e '.[dev]')",
)

HIDDEN, FFN, HEADS, LAYERS = 32, 64, 4, 1
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ w", "Ġw o"]


def vocabulary() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel

    return CONTROL_TOKENS + sorted(ByteLevel.alphabet()) + ["Ġw", "Ġwo"]


def write_tiny_llama_gguf(
    path: Path, *, qtype=None, seed: int = 0, chat_template: str | None = None
) -> dict[str, np.ndarray]:
    """Write the file; returns the float32 weights *as stored* (dequantized by the gguf package),
    keyed by their GGUF names, as an independent reference for the loaded model."""
    qtype = gguf.GGMLQuantizationType.Q4_1 if qtype is None else qtype
    tokens = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    rng = np.random.default_rng(seed)
    stored: dict[str, np.ndarray] = {}

    def add(name: str, shape: tuple[int, ...]) -> None:
        if len(shape) == 1:  # norms stay float32, as in llama.cpp exports
            data = np.ones(shape, np.float32)
            writer.add_tensor(name, data)
            stored[name] = data
            return
        data = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        packed = gguf.quants.quantize(data, qtype)
        writer.add_tensor(name, packed, raw_dtype=qtype)
        stored[name] = gguf.quants.dequantize(packed, qtype).reshape(shape)

    add("token_embd.weight", (len(tokens), HIDDEN))
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,))
        for part in ("q", "k", "v", "output"):
            add(f"blk.{i}.attn_{part}.weight", (HIDDEN, HIDDEN))
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,))
        add(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN))
    add("output_norm.weight", (HIDDEN,))
    add("output.weight", (len(tokens), HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
