"""Trust under misuse, config and data files: every mistake a user can make in the
--config file or a data file exits with code 2 and one message naming the file (line, key), the
value and the fix: no traceback, no "bug in rlhf", and the user's files as they were."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.support.reliability_testing import InProcess, assert_ok, assert_user_error, write_jsonl


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sft(capsys, files, out: Path, *extra) -> InProcess:
    return InProcess(capsys, "sft", "--model", files["policy"], "--data", files["sft"], "--out", out, *extra)


# --- the --config file ----------------------------------------------------------------------------


@pytest.mark.slow
def test_config_naming_a_directory_is_a_user_error(files, tmp_path, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    result = sft(capsys, files, tmp_path / "run", "--config", folder)
    assert_user_error(result, str(folder), "is a directory", "Fix:", "--config DIR/FILE.yaml")
    assert not (tmp_path / "run").exists() and list(folder.iterdir()) == []


def test_a_missing_config_file_is_named(files, tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert_user_error(
        sft(capsys, files, tmp_path / "run", "--config", missing), str(missing), "not found", "Fix:"
    )


def test_an_unreadable_config_file_is_named(files, tmp_path, capsys, monkeypatch):
    # as root no file mode refuses a read: the refusal the OS would give is what the reader sees
    config = tmp_path / "locked.yaml"
    config.write_text("seed: 1\n")
    real = Path.read_text

    def refuse(self, *args, **kwargs):
        if self == config:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, str(config), "permission denied", "Fix:", "chmod u+r")
    assert not (tmp_path / "run").exists()


def test_a_binary_config_file_is_named(files, tmp_path, capsys):
    config = tmp_path / "model.yaml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    before = digest(config)
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, str(config), "not a text file", "Fix:")
    assert digest(config) == before


def test_a_wrong_type_in_yaml_names_the_key_value_and_fix(files, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  max_steps: ten\n")
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, str(config), "train.max_steps must be an integer >= 1, got 'ten'", "Fix:")


def test_a_list_where_a_path_goes_names_the_key_and_a_fix(files, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  path: [a.jsonl, b.jsonl]\n")
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, str(config), "data.path must be a string", "Fix: give data.path a string")


def test_a_group_given_a_value_names_the_group(files, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("train: 5\n")
    assert_user_error(
        sft(capsys, files, tmp_path / "run", "--config", config), "train must be a mapping", "Fix:"
    )


def test_a_negative_size_in_yaml_names_the_key(files, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  batch_size: -4\n")
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, str(config), "train.batch_size must be >= 1", "got -4", "Fix:")


@pytest.mark.slow
def test_an_exponent_learning_rate_in_yaml_is_a_number(files, tmp_path, capsys):
    # YAML 1.1 reads `1e-3` (no dot) as a string; the flag `--optim.lr 1e-3` was always a number
    config = tmp_path / "c.yaml"
    config.write_text("optim:\n  lr: 1e-3\ntrain:\n  max_steps: 1\n  batch_size: 2\nsinks: [jsonl]\n")
    assert_ok(sft(capsys, files, tmp_path / "run", "--config", config))
    assert "lr: 0.001" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_group_given_twice_in_yaml_is_refused_not_silently_merged(files, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("optim:\n  lr: 0.001\ntrain:\n  max_steps: 1\noptim:\n  weight_decay: 0.1\n")
    result = sft(capsys, files, tmp_path / "run", "--config", config)
    assert_user_error(result, f"{config}:5", "'optim' is given twice", "first on line 1", "Fix: merge")
    assert not (tmp_path / "run").exists()


def test_an_unknown_preset_names_the_choices(files, tmp_path, capsys):
    result = InProcess(capsys, "train", "--preset", "ppo-max", "--policy", files["policy"],
                       "--reward-model", files["rm"], "--prompts", files["prompts"], "--out", tmp_path / "run")  # fmt: skip
    assert_user_error(result, "unknown preset 'ppo-max'", "Fix:", "ppo_max")
    assert not (tmp_path / "run").exists()


def test_demo_config_errors_are_user_errors(tmp_path, capsys):
    missing = tmp_path / "demo.yaml"
    assert_user_error(
        InProcess(capsys, "demo", "--out", tmp_path / "d", "--config", missing), str(missing), "Fix:"
    )
    missing.write_text("a: b: c\n")
    assert_user_error(
        InProcess(capsys, "demo", "--out", tmp_path / "d", "--config", missing), "not valid YAML", "Fix:"
    )


# --- data files -----------------------------------------------------------------------------------


def _gzip_damaged_in_its_deflate_stream(rows: list[dict]) -> bytes:
    """A gzip file whose compressed bytes are damaged: zlib refuses it (zlib.error, not OSError)."""
    data = bytearray(gzip.compress("".join(json.dumps(r) + "\n" for r in rows * 30).encode()))
    data[10] ^= 0xFF  # the first byte of the deflate stream
    return bytes(data)


@pytest.mark.parametrize("stage,data,name", [("sft", "sft", "d.jsonl"), ("rm", "pairs", "d.json"),
                                             ("dpo", "pairs", "d.jsonl")])  # fmt: skip
def test_damaged_gzip_behind_a_data_name_is_named(stage, data, name, files, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(
        _gzip_damaged_in_its_deflate_stream([json.loads(files[data].read_text().splitlines()[0])])
    )
    before = digest(path)
    result = InProcess(capsys, stage, "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert_user_error(result, str(path), "gzip-compressed", "damaged", "Fix:")
    assert digest(path) == before and not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["d.jsonl", "d.json"])
def test_binary_behind_a_data_name_is_named(name, files, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" + os.urandom(64))
    result = InProcess(capsys, "sft", "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert_user_error(result, f"{path}:1", "Fix:")
    assert "binary" in result.stderr or "not UTF-8" in result.stderr


def test_garbage_behind_a_parquet_name_is_named(files, tmp_path, capsys):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"not a parquet file at all\n" * 4)
    result = InProcess(capsys, "rm", "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert_user_error(result, str(path), "cannot read the Parquet file", "Fix:")


@pytest.mark.parametrize(
    "lines,named",
    [
        ("", ["holds no records"]),  # an empty file
        ('{"prompt": "a b", "response": "c"}\n[1, 2]\n', [":2", "must be a JSON object"]),
        ('{"prompt": "a b", "response": "c"}\n{"prompt": "a b"}\n', [":2", "missing field"]),
        ('{"prompt": "a b", "response": null}\n', [":1", "field 'response' is null"]),
        ('{"prompt": "a b", "response": 5}\n', [":1", "must be a string"]),
        ('{"prompt": "", "response": "c"}\n', [":1", "field 'prompt' is empty"]),
    ],
    ids=["empty", "not-an-object", "missing-column", "null", "number", "blank"],
)
def test_a_bad_data_line_is_named(lines, named, files, tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(lines)
    result = InProcess(capsys, "sft", "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert_user_error(result, str(path), *named, "Fix:")
    assert path.read_text() == lines


@pytest.mark.parametrize("name,named", [("d.jsonl", ":2"), ("d.json", "d.json")])
def test_json_nested_too_deeply_is_named(name, named, files, tmp_path, capsys):
    path = tmp_path / name
    nested = "[" * 100_000 + "]" * 100_000
    path.write_text(
        '{"prompt": "a b", "response": "c"}\n' + nested + "\n" if name.endswith("l") else f"[{nested}]"
    )
    result = InProcess(capsys, "sft", "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert_user_error(result, named, "nested too deeply", "Fix:")


# --- `rlhf data check`: the exit code of the training commands ------------------------------------


@pytest.mark.parametrize(
    "content",
    [b'{"prompt": "a b", "response": "c"}\n{"prompt": \n', b"", None],
    ids=["bad-line", "empty", "damaged-gzip"],
)
def test_data_check_exits_like_sft_on_the_same_file(content, files, tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        content if content is not None else _gzip_damaged_in_its_deflate_stream([{"prompt": "a"}])
    )
    check = InProcess(capsys, "data", "check", path)
    trained = InProcess(capsys, "sft", "--model", files["policy"], "--data", path, "--out", tmp_path / "run")
    assert check.returncode == trained.returncode == 2, (check.stderr, trained.stderr)
    assert str(path) in check.stderr and "Traceback" not in check.stderr
    assert check.stderr.count("Fix:") == 1  # one message, its fix given once


# --- rows longer than the model's positions -------------------------------------------------------


@pytest.fixture(scope="module")
def short_gpt2(tmp_path_factory) -> Path:
    """A GPT-2 of 12 positions: past them its position table raises IndexError mid-step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf.models.tiny import word_tokenizer
    from tests.support.reliability_testing import WORDS

    tok = word_tokenizer([" ".join(WORDS)])
    config = GPT2Config(vocab_size=len(tok), n_positions=12, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    directory = tmp_path_factory.mktemp("gpt2") / "short-gpt2"
    GPT2LMHeadModel(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


LONG = " ".join("a b c d e f g h i j k l m n o".split())


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage,row",
    [
        ("sft", {"prompt": LONG, "response": LONG}),
        ("rm", {"prompt": LONG, "chosen": LONG, "rejected": "d"}),
        ("dpo", {"prompt": LONG, "chosen": "c", "rejected": LONG}),
    ],
)
def test_a_row_longer_than_the_model_is_named_with_the_budget_that_fits(
    stage, row, short_gpt2, tmp_path, capsys
):
    short = {key: {"prompt": "a b", "rejected": "d"}.get(key, "c") for key in row}
    data = write_jsonl(tmp_path / "d.jsonl", [short, short, short, row, short, short])
    before = digest(data)
    args = [stage, "--model", short_gpt2, "--data", data, "--out", tmp_path / "run", "--sinks", "jsonl"]
    refused = InProcess(capsys, *args)
    what = "row" if stage == "sft" else "pair"
    assert_user_error(refused, f"{data}:4", f"the {what} needs 31 positions", "short-gpt2 has 12",
                      "--data.max_prompt_tokens", "at most 12")  # fmt: skip
    assert digest(data) == before and not (tmp_path / "run" / "metrics.jsonl").exists()
    fits = ["--data.max_prompt_tokens", "4", "--data.max_response_tokens", "8", "--train.max_steps", "1"]
    assert_ok(InProcess(capsys, *args, *fits, "--train.batch_size", "2"))
