"""Two models that read the same token ids must share a tokenizer.

`rlhf train` samples with the policy's tokenizer and hands the reward model the same ids; `rlhf eval`
encodes every prompt with the policy's tokenizer for the baseline and the judge too. A model trained
on another vocabulary reads those ids as other words: its log-probs and rewards are meaningless, and
nothing fails. `check_same_tokenizer` compares what the ids mean, cheaply: the vocabulary's size,
its special tokens and a sha256 over its (token, id) pairs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rlhf.models.loading import ModelLoadingError, load_tokenizer

SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def tokenizer_signature(tokenizer) -> dict:
    """{"size": tokens, "special": {name: (token, id)}, "vocab_sha256": sha256 of the sorted
    (token, id) pairs} of a (prepared) tokenizer."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256()
    for token, index in sorted(vocab.items(), key=lambda item: (item[1], item[0])):
        digest.update(f"{index}\t{token}\n".encode())
    special = {}
    for name in SPECIAL:
        token = getattr(tokenizer, name, None)
        special[name] = (None, None) if token is None else (str(token), vocab.get(str(token)))
    extra = sorted(str(t) for t in getattr(tokenizer, "additional_special_tokens", None) or [])
    special["additional_special_tokens"] = (", ".join(extra) or None, None)
    return {"size": len(vocab), "special": special, "vocab_sha256": digest.hexdigest()}


def tokenizer_differences(a, b) -> list[str]:
    """What differs between tokenizers `a` and `b` (in the words of a message); [] when they agree."""
    sa, sb = tokenizer_signature(a), tokenizer_signature(b)
    found = []
    if sa["size"] != sb["size"]:
        found.append(f"vocabulary size {sa['size']} vs {sb['size']}")
    for name in sa["special"]:
        if sa["special"][name] != sb["special"][name]:
            (ta, ia), (tb, ib) = sa["special"][name], sb["special"][name]
            found.append(
                f"{name} {ta!r}{'' if ia is None else f' (id {ia})'} vs {tb!r}{'' if ib is None else f' (id {ib})'}"
            )
    if sa["vocab_sha256"] != sb["vocab_sha256"]:
        va, vb = a.get_vocab(), b.get_vocab()
        other = sorted((t for t in va if vb.get(t) != va[t]), key=va.get)
        example = ""
        if other:
            t = other[0]
            example = f", e.g. {t!r} is id {va[t]} in one and {'absent' if t not in vb else f'id {vb[t]}'} in the other"
        found.append(f"the vocabularies differ: {len(other)} of {len(va)} tokens map to other ids{example}")
    return found


def has_tokenizer(directory: str | os.PathLike) -> bool:
    """Whether `directory` is a local directory with tokenizer files (a model saved without one has
    none, and a hub id is no local directory: nothing to compare)."""
    root = Path(directory)
    return root.is_dir() and any((root / name).is_file() for name in TOKENIZER_FILES)


def check_same_tokenizer(
    tokenizer, name: str, other_dir: str | os.PathLike, other_name: str, *, fix: str
) -> None:
    """Raise ModelLoadingError when the tokenizer saved in `other_dir` (`other_name`, e.g. "--reward-model
    runs/rm") is not `tokenizer` (`name`, e.g. "--policy runs/sft"), naming both and what differs. A
    directory without tokenizer files is not compared."""
    if not has_tokenizer(other_dir):
        return
    differences = tokenizer_differences(tokenizer, load_tokenizer(other_dir))
    if differences:
        raise ModelLoadingError(
            f"{name} and {other_name} have different tokenizers ({'; '.join(differences)}): the token ids of "
            f"one mean other words to the other, so every score would be meaningless. Fix: {fix}."
        )
