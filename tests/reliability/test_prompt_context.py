"""Prompts longer than the model's positions are caught at load (not an IndexError mid-run, not a
silent run on untrained positions): the message names the file, the line and the flag that fits."""

from __future__ import annotations

import pytest

from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from tests.support.reliability_testing import (
    WORDS,
    InProcess,
    assert_ok,
    assert_user_error,
    iterations,
    train_args,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # every test here takes over 2 s (`make test-fast` leaves them out)


def test_a_prompt_past_the_context_is_named_and_the_budget_flag_fixes_it(files, tmp_path, capsys):
    tok = word_tokenizer([" ".join(WORDS)])
    short = tmp_path / "short-context"
    tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, max_positions=12).save_pretrained(
        short
    )
    tok.save_pretrained(short)
    long_prompt = " ".join(WORDS[:15])
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "a b"}, {"prompt": "c d e"}, {"prompt": long_prompt}, {"prompt": "f g"}],
    )
    run_files = {**files, "policy": short, "prompts": prompts}
    args = train_args(run_files, tmp_path / "run", "--train.iterations", "1", "--rollout.max_new_tokens", "4")
    refused = InProcess(capsys, *args)
    assert_user_error(
        refused, f"{prompts}:3", "needs 19 positions", "short-context has 12", "--data.max_prompt_tokens 8"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert_ok(InProcess(capsys, *args, "--data.max_prompt_tokens", "8"))
    assert iterations(tmp_path / "run") == [0]
