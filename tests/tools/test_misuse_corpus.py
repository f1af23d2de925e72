"""tools/misuse_corpus.py: a fast subset of the misuse misuse_corpus, run in this process (each case in a
fresh copy of the tiny misuse_inputs): the exit code, the words of the message, no traceback and every file
of the user's unchanged; and the runner itself reports a case that does not hold."""

from __future__ import annotations

import pytest

# cases that stop before any training (the whole corpus: `python tools/misuse_corpus.py`)
FAST = [
    "config_is_directory", "out_is_existing_file", "sft_out_is_model", "data_check_invalid_exit_2",
    "yaml_bom", "yaml_crlf", "yaml_duplicate_key", "yaml_utf16", "huge_float_lr", "inf_kl_beta",
    "negative_count", "data_not_json", "data_utf16", "chat_bad_role", "model_truncated_weights",
    "model_without_tokenizer", "resume_a_model_dir", "out_under_a_file", "out_name_too_long",
    "out_on_read_only_fs",
]  # fmt: skip


def test_the_corpus_is_well_formed(misuse_corpus):
    names = [case.name for case in misuse_corpus.CASES]
    assert len(names) == len(set(names)) and set(FAST) <= set(names)
    assert len(misuse_corpus.NEW) >= 30
    assert all(case.code in (0, 2) for case in misuse_corpus.CASES)  # exit 1 is a bug, never an expectation
    assert all(case.words or case.code == 0 for case in misuse_corpus.CASES)  # a refusal says something


@pytest.mark.parametrize("name", FAST)
def test_a_user_mistake_is_one_clear_exit_2_and_touches_nothing(misuse_corpus, misuse_inputs, tmp_path, name):
    case = next(c for c in misuse_corpus.CASES if c.name == name)
    outcome = misuse_corpus.run_case(case, misuse_inputs, tmp_path, in_process=True)
    assert outcome.ok, misuse_corpus.table([outcome])


def test_the_runner_reports_a_case_that_does_not_hold(misuse_corpus, misuse_inputs, tmp_path, monkeypatch):
    wrong = misuse_corpus.Case("expects_success", ["sft", "--model", "policy", "--out", "policy"], code=0)
    outcome = misuse_corpus.run_case(wrong, misuse_inputs, tmp_path, in_process=True)
    assert not outcome.ok and outcome.code == 2 and "FAIL: exit 2" in misuse_corpus.table([outcome])

    def clobber(args, work):  # a command that overwrites a file of the user's and says nothing
        (work / "sft.jsonl").write_text("gone\n")
        return 2, "", "Traceback (most recent call last):\n"

    monkeypatch.setattr(misuse_corpus, "_in_process", clobber)
    outcome = misuse_corpus.run_case(
        misuse_corpus.Case("clobbers", ["sft"], words=("Fix",)), misuse_inputs, tmp_path, in_process=True
    )
    assert outcome.changed == ["sft.jsonl"] and outcome.traceback and outcome.missing == ["Fix"]
    assert not outcome.ok
