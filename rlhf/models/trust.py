"""What loading a model directory may do: never run its code, unpickle only when asked.

By default every transformers `from_pretrained` gets `trust_remote_code=False`, and a directory whose
`config.json` / `tokenizer_config.json` names custom code (`auto_map`) is refused (`--trust-remote-code`
lifts it). Weights load from safetensors only: pickle files are refused unless `--allow-pickle`, and
even then torch's weights-only unpickler reads them (a file it rejects is reported unsafe: convert it
to safetensors). The policy is process-wide (`set_load_policy`), set once by the CLI.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

TRUST_FLAG = "--trust-remote-code"
PICKLE_FLAG = "--allow-pickle"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass(frozen=True)
class LoadPolicy:
    trust_remote_code: bool = False  # let transformers import Python files of a model directory
    allow_pickle: bool = False  # read pickle weights (torch's weights-only unpickler) when no safetensors


_policy = LoadPolicy()


def set_load_policy(*, trust_remote_code: bool = False, allow_pickle: bool = False) -> None:
    global _policy
    _policy = LoadPolicy(trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)


def load_policy() -> LoadPolicy:
    return _policy


def safe_load_kwargs(*, weights: bool = True) -> dict:
    """Keyword arguments for a transformers `from_pretrained` under the current policy
    (`weights=False` for tokenizers and configs, which have no weights)."""
    kwargs: dict = {"trust_remote_code": _policy.trust_remote_code}
    if weights and not _policy.allow_pickle:
        kwargs["use_safetensors"] = True
    return kwargs


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # an unreadable file is reported by the loader itself
    return data if isinstance(data, dict) else {}


def check_model_directory(path: str | os.PathLike, *, weights: bool = True) -> None:
    """Raise ModelLoadingError (naming the file and the flag) when loading the local directory `path`
    would run its code or unpickle its weights without the user's flag. Hub ids are not checked here
    (`safe_load_kwargs` covers them)."""
    from rlhf.models.loading import ModelLoadingError

    p = Path(path)
    if not p.is_dir():
        return
    if not _policy.trust_remote_code:
        for name in ("config.json", "tokenizer_config.json"):
            if "auto_map" in _read_json(p / name):
                raise ModelLoadingError(
                    f"{p / name} names custom Python code (auto_map), which rlhf does not run by default. "
                    f"Fix: pass {TRUST_FLAG} if you wrote or audited the .py files of {p}, or use a model "
                    "whose architecture transformers ships."
                )
    if not weights or _policy.allow_pickle:
        return
    has_safetensors = any(p.glob("*.safetensors"))
    pickles = sorted(f.name for f in p.iterdir() if f.is_file() and f.suffix in PICKLE_SUFFIXES)
    if pickles and not has_safetensors:
        raise ModelLoadingError(
            f"{p} holds weights only as pickle ({', '.join(pickles)}); rlhf loads safetensors by default, "
            "since a pickle file can carry code. Fix: convert them to safetensors where they came from "
            f"(save_pretrained writes safetensors), or pass {PICKLE_FLAG} to read them with torch's "
            "weights-only unpickler."
        )


def unsafe_pickle_error(path: str | os.PathLike):
    """The error for pickle weights that torch's weights-only unpickler rejected."""
    from rlhf.models.loading import ModelLoadingError

    return ModelLoadingError(
        f"the pickle weights in {path} hold objects other than tensors, which rlhf will not unpickle "
        "(they could run code). Fix: convert the weights to safetensors in the environment they came "
        "from, or use another model."
    )
