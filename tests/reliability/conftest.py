"""Fixtures of the reliability suite: a tiny Llama policy and reward model saved as directories,
and small data files, built once per session; `rlhf` runs as a user would run it, in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from tests.support.cli_data import pair_rows, sft_rows
from tests.support.reliability_testing import WORDS, write_jsonl

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reliability")
    tok = word_tokenizer([" ".join(WORDS)])
    policy = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    policy.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    reward_model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2), head_init_std=0.5
    )
    reward_model.save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    sft, pairs = sft_rows(WORDS), pair_rows(WORDS)
    return {
        "root": root,
        "policy": root / "policy",
        "rm": root / "rm",
        "sft": write_jsonl(root / "sft.jsonl", sft),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "prompts": write_jsonl(root / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pairs[:12]]),
    }
