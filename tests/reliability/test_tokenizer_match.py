"""A policy and a reward model (or eval's baseline and judge) with different tokenizers are refused,
exit 2, naming both directories and what differs: the token ids of one are other words to the other,
so every reward would be meaningless (it used to train with exit 0)."""

from __future__ import annotations

import pytest

from rlhf.models.tiny import word_tokenizer
from rlhf.models.tokenizer_match import tokenizer_differences
from tests.support.reliability_testing import (
    WORDS,
    InProcess,
    assert_user_error,
    logged_warnings,
    other_tokenizer_reward_model,
    train_args,
)


def test_tokenizers_are_compared_by_size_special_tokens_and_vocabulary():
    tok = word_tokenizer([" ".join(WORDS)])
    assert tokenizer_differences(tok, word_tokenizer([" ".join(WORDS)])) == []
    upper = tokenizer_differences(tok, word_tokenizer([" ".join(w.upper() for w in WORDS)]))
    assert len(upper) == 1 and "the vocabularies differ: 20 of 24 tokens map to other ids" in upper[0]
    bigger = tokenizer_differences(tok, word_tokenizer([" ".join([*WORDS, "extra"])]))
    assert "vocabulary size 24 vs 25" in bigger
    other_eos = word_tokenizer([" ".join(WORDS)])
    other_eos.eos_token = "t"
    assert any(d.startswith("eos_token '<eos>' (id 3) vs 't'") for d in tokenizer_differences(tok, other_eos))


@pytest.fixture(scope="module")
def other_rm(tmp_path_factory):
    return other_tokenizer_reward_model(tmp_path_factory.mktemp("tokenizers") / "rm_upper")


@pytest.mark.slow
def test_train_with_a_reward_model_of_another_tokenizer_is_refused(files, other_rm, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    result = InProcess(capsys, *train_args({**files, "rm": other_rm}, out, "--train.iterations", "1"))
    message = assert_user_error(
        result, f"--policy {files['policy']}", f"--reward-model {other_rm}", "vocabularies differ", "Fix:"
    )
    assert message.count("\n") == 1 and logged_warnings(caplog) == []  # one message
    assert not (out / "metrics.jsonl").exists()  # stopped before any work


@pytest.mark.parametrize("flag", ["--baseline", "--judge"])
def test_eval_with_a_baseline_or_judge_of_another_tokenizer_is_refused(
    flag, files, other_rm, tmp_path, capsys
):
    models = {"--baseline": files["policy"], "--judge": files["rm"], flag: other_rm}
    out = tmp_path / "eval.json"
    result = InProcess(capsys, "eval", "--policy", files["policy"], "--baseline", models["--baseline"],
                       "--judge", models["--judge"], "--prompts", files["prompts"], "--n", "2", "--out", out)  # fmt: skip
    assert_user_error(
        result, f"--policy {files['policy']}", f"{flag} {other_rm}", "vocabularies differ", "Fix:"
    )
    assert not out.exists()
