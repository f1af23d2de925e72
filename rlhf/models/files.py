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


def damaged_safetensors(path: Path) -> str | None:
    """What is wrong with the safetensors file `path`, or None: its header (8 bytes of length, then
    JSON) cut short or unreadable, or its data shorter than the header says (a copy or download cut
    short). Reads the header only."""
    import json

    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or length > size - 8:
                return f"it has {size} bytes, too few for the header it starts"
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as err:
        return f"its header cannot be read ({err})"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    ends = [v["data_offsets"][1] for k, v in header.items() if isinstance(v, dict) and "data_offsets" in v]
    needed = 8 + length + max(ends, default=0)
    return f"it has {size} bytes, its header describes {needed}" if needed > size else None


def check_weights_whole(directory: str | Path) -> None:
    """Raise ModelLoadingError naming the first damaged `*.safetensors` file of the local directory
    `directory` (a hub id or a missing directory: nothing to check)."""
    from rlhf.models.loading import ModelLoadingError

    root = Path(directory)
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.safetensors")):
        problem = damaged_safetensors(path)
        if problem is not None:
            raise ModelLoadingError(
                f"{path} is damaged: {problem}. Fix: copy or save the model again (save_pretrained), "
                "or point at an intact model directory."
            )
