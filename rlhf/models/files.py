"""Which files of a model directory make the model: its weights, its configs and its tokenizer.

A run directory of `rlhf sft` or `rlhf rm` is also a model directory, but it holds the run's records
too (metrics.jsonl, report.html, config.yaml, an eval.json that `rlhf eval` wrote beside the policy):
those change without changing the model. `model_files` names only what a load reads, so that a
fingerprint of a model (`rlhf train` records one, rlhf/rundir/run_inputs.py) and an export that
replaces one (rlhf/rundir/checkpoint.py) leave the records alone.
"""

from __future__ import annotations

from pathlib import Path

# files a Hugging Face load reads besides the weights (the tokenizer's included)
MODEL_FILE_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "adapter_config.json",
        "scalar_head.json",  # rlhf's reward-model head (rlhf/models/scalar_head.py)
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
        "chat_template.jinja",
        "chat_template.json",
    }
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")


def is_model_file(name: str) -> bool:
    """Whether a file of that name, at the top of a model directory, is part of the model."""
    return not name.startswith(".") and (name in MODEL_FILE_NAMES or name.endswith(WEIGHT_SUFFIXES))


def model_files(directory: str | Path, gguf_file: str | None = None) -> list[Path]:
    """The files of the model in `directory`, sorted: weights (safetensors, pickle, the named GGUF
    file), configs and tokenizer files. [] when `directory` is not a local directory (a hub id)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_file() and is_model_file(p.name)]
    if gguf_file:
        gguf = root / gguf_file if (root / gguf_file).is_file() else Path(gguf_file)
        if gguf.is_file():
            found.append(gguf)
    return sorted(found)
