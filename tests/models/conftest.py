"""Tiny models and tokenizers shared by the models-layer tests (hidden 32, 2 layers)."""

from __future__ import annotations

import pytest

from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

WORDS = " ".join(f"w{i}" for i in range(40))


@pytest.fixture(scope="session")
def tokenizer():
    return word_tokenizer([WORDS])


@pytest.fixture(scope="session")
def _base_lm(tokenizer):
    return tiny_causal_lm(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=4)


@pytest.fixture()
def lm(_base_lm):
    """A fresh copy per test (tests may wrap it with LoRA or change weights)."""
    import copy

    return copy.deepcopy(_base_lm)
