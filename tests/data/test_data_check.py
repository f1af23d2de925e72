"""`rlhf data check`: output and exit codes."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from rlhf.data.check import add_check_arguments, length_summary, percentile, run_check
from rlhf.models.tiny import word_tokenizer


def check(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rlhf data check")
    add_check_arguments(parser)
    return run_check(parser.parse_args([str(a) for a in argv]))


def write_jsonl(path, rows) -> str:
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def sft_file(tmp_path):
    return write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "ab", "response": "xyz"}, {"prompt": "abcdef", "response": "x"}]
    )


def test_valid_file_prints_format_counts_and_char_lengths(sft_file, capsys):
    assert check(sft_file) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[:3] == [
        f"file: {sft_file}",
        "format: sft (used as sft examples)",
        "records: 2 valid, 0 invalid",
    ]
    assert lines[3] == "lengths in characters:"
    assert lines[4].split() == ["field", "min", "mean", "p50", "p95", "max"]
    assert lines[5].split() == ["prompt", "2", "4.0", "4", "6", "6"]
    assert lines[6].split() == ["response", "1", "2.0", "2", "3", "3"]
    assert lines[-1] == "OK"


def test_first_bad_line_fails_with_file_line_and_fix(tmp_path, capsys):
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"prompt": "p", "response": "r"}, "{nope\n", {"prompt": "p", "response": 2}]
    )
    assert check(path) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {path}:2: invalid JSON")
    assert "Fix:" in err and ":3:" not in err


def test_all_errors_lists_every_bad_line_and_still_describes_the_rest(tmp_path, capsys):
    rows = [
        {"prompt": "p", "response": "r"},
        "{nope\n",
        {"prompt": "p", "response": 2},
        {"prompt": "p", "response": " "},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    assert check(path, "--all-errors") == 2
    out, err = capsys.readouterr()
    error_lines = err.splitlines()
    assert [line.split(": ")[1].rsplit(":", 1)[1] for line in error_lines] == ["2", "3", "4"]
    assert "records: 1 valid, 3 invalid" in out
    assert out.splitlines()[-1] == "FAILED: 3 invalid record(s)"


def test_kind_and_format_options(tmp_path, capsys):
    hh = "\n\nHuman: hi\n\nAssistant:"
    path = write_jsonl(tmp_path / "hh.jsonl", [{"chosen": hh + " good", "rejected": hh + " bad"}])
    assert check(path) == 0
    out = capsys.readouterr().out
    assert "format: hh (used as preference examples)" in out
    assert [line.split()[0] for line in out.splitlines()[5:8]] == ["prompt", "chosen", "rejected"]
    assert check(path, "--kind", "prompt") == 0
    assert "format: hh (used as prompt examples; only the prompts are read)" in capsys.readouterr().out
    assert check(path, "--format", "sft") == 2
    assert "missing field 'prompt'" in capsys.readouterr().err


def test_token_lengths_and_truncation_counts(tmp_path, capsys):
    tokenizer = word_tokenizer(["Human: Assistant: a b c d e f g"], add_bos=True)
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [
        {
            "chosen": "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d e f",
            "rejected": "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: g",
        },
        {"chosen": "\n\nHuman: a b\n\nAssistant: c", "rejected": "\n\nHuman: a b\n\nAssistant: d"},
    ]
    path = write_jsonl(tmp_path / "hh.jsonl", rows)
    code = check(path, "--tokenizer", tmp_path / "tok", "--max-prompt-tokens", 4, "--max-response-tokens", 3)
    assert code == 0
    out = capsys.readouterr().out
    assert "lengths in tokens (responses include EOS):" in out
    table = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.startswith("  ") and "field" not in line
    }
    # prompts: <bos> Human: a Assistant: b Human: c Assistant: (8) and <bos> Human: a b Assistant: (5)
    assert table["prompt"] == ["5", "6.5", "6", "8", "8"]
    assert table["chosen"] == ["2", "3.0", "3", "4", "4"]  # "d e f <eos>" and "c <eos>"
    assert table["rejected"] == ["2", "2.0", "2", "2", "2"]
    assert (
        "truncation (max prompt tokens 4, max response tokens 3): prompts 2/2 truncated (100.0%): 1/2 had turns dropped (2 turns), "
        "1/2 left-truncated; responses 1/4 truncated"
    ) in out


def test_truncation_needs_a_tokenizer(sft_file, capsys):
    assert check(sft_file, "--max-prompt-tokens", "4") == 0
    assert "truncation: give --tokenizer" in capsys.readouterr().out


def test_unusable_tokenizer_and_empty_file(tmp_path, sft_file, capsys):
    assert check(sft_file, "--tokenizer", tmp_path / "missing") == 2
    assert "cannot load the tokenizer" in capsys.readouterr().err
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    assert check(empty) == 2
    assert "the file holds no records (it is empty)" in capsys.readouterr().err
    assert check(empty, "--format", "sft", "--all-errors") == 2
    assert capsys.readouterr().out.splitlines()[-1] == "FAILED: no records"


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 100):
        values = sorted(rng.integers(0, 1000, size).tolist())
        for q in (0, 50, 95, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert length_summary([3, 1, 2]) == {
        "min": 1,
        "mean": 2.0,
        "p50": 2.0,
        "p95": pytest.approx(2.9),
        "max": 3,
    }


# --- data.system_prompt: prompts encoded as the stages encode them ----------------------------------

SMOLLM2_LIKE = (  # writes its own system prompt (6 tokens) when the messages hold none, as SmolLM2's
    "{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nS w1 w2<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokens(user_assistant_words: list[str], default_system: bool) -> int:
    """A plain count of the rendered prompt's tokens: <|im_start|> role words <|im_end|> per message,
    <|im_start|> assistant for the generation prompt, and <|im_start|> system S w1 w2 <|im_end|>."""
    return sum(3 + len(words.split()) for words in user_assistant_words) + 2 + (6 if default_system else 0)


@pytest.mark.parametrize("setting", ["template", "none"])
def test_system_prompt_setting_counts_prompt_tokens_and_truncations_as_the_stages(tmp_path, capsys, setting):
    tokenizer = word_tokenizer(["Human: Assistant: S w1 w2 w3 w4 w5 w6 w7 w8"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = SMOLLM2_LIKE
    tokenizer.save_pretrained(tmp_path / "tok")
    short = "\n\nHuman: w4\n\nAssistant:"
    long = "\n\nHuman: w1 w2\n\nAssistant: w3\n\nHuman: w4 w5 w6\n\nAssistant: w7\n\nHuman: w8\n\nAssistant:"
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": short}, {"prompt": long}])
    code = check(
        path, "--tokenizer", tmp_path / "tok", "--max-prompt-tokens", 10, "--data.system_prompt", setting
    )
    assert code == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("  prompt"))
    default_system = setting == "template"
    sizes = [
        chatml_tokens(["w4"], default_system),
        chatml_tokens(["w1 w2", "w3", "w4 w5 w6", "w7", "w8"], default_system),
    ]
    assert sizes == ([12, 31] if default_system else [6, 25])
    assert row[1::4] == [str(min(sizes)), str(max(sizes))]  # min and max columns
    assert float(row[2]) == sum(sizes) / 2
    # a 10-token budget: the short prompt fits only without the default system prompt
    truncated = sum(size > 10 for size in sizes)
    assert truncated == (2 if default_system else 1)
    assert f"prompts {truncated}/2 truncated ({truncated / 2:.1%})" in out


def test_a_bad_system_prompt_setting_is_refused_naming_the_key_and_its_values(sft_file, capsys):
    assert check(sft_file, "--data.system_prompt", "off") == 2
    err = capsys.readouterr().err
    assert "--data.system_prompt 'off' is not one of template, none" in err and "Fix:" in err
