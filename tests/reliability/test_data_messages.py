"""Data errors suggest `--skip-invalid`, and that spelling works in every command that reads data;
skipped rows are counted and named. Gzip behind a .jsonl name is read; CSV behind it is named."""

from __future__ import annotations

import gzip

import pytest

from rlhf.cli import main
from tests.support.reliability_testing import InProcess, assert_ok, assert_user_error


def with_bad_lines(source, path):
    good = source.read_text().splitlines()
    path.write_text("\n".join([good[0], "{broken", *good[1:6], '{"prompt": "a b"}']) + "\n")
    return path


@pytest.mark.slow
def test_sft_suggests_skip_invalid_and_the_suggestion_works(files, tmp_path, capsys, caplog):
    data = with_bad_lines(files["sft"], tmp_path / "sft.jsonl")
    args = ["sft", "--model", files["policy"], "--data", data, "--out", tmp_path / "run",
            "--train.max_steps", "1", "--train.batch_size", "2", "--sinks", "jsonl"]  # fmt: skip
    stderr = assert_user_error(InProcess(capsys, *args), f"{data}:2", "invalid JSON", "--skip-invalid")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert_ok(InProcess(capsys, *args, "--skip-invalid"))
    # the warning goes to stderr through logging (pytest's log capture in this process)
    assert f"2 invalid record(s) skipped in {data}" in caplog.text and f"{data}:8" in caplog.text
    assert "skip_invalid" not in stderr.split("Fix:")[1].split(";")[0]  # the flag comes first


def test_data_check_accepts_skip_invalid(files, tmp_path, capsys):
    data = with_bad_lines(files["sft"], tmp_path / "sft.jsonl")
    assert main(["data", "check", str(data)]) == 2
    assert "--skip-invalid" in capsys.readouterr().err
    assert main(["data", "check", str(data), "--skip-invalid"]) == 0
    captured = capsys.readouterr()
    assert "records: 6 valid, 2 invalid" in captured.out and "OK with --skip-invalid" in captured.out
    assert f"skipped: {data}:2" in captured.err


def test_gzip_content_behind_a_jsonl_name_is_read(files, tmp_path, capsys):
    packed = tmp_path / "sft.jsonl"
    packed.write_bytes(gzip.compress(files["sft"].read_bytes()))
    assert main(["data", "check", str(packed)]) == 0
    assert "records: 16 valid, 0 invalid" in capsys.readouterr().out


def test_csv_behind_a_jsonl_name_is_named(tmp_path, capsys):
    table = tmp_path / "sft.jsonl"
    table.write_text("prompt,response\nhello,world\n")
    assert main(["data", "check", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"{table}:1" in err and "looks like CSV" in err and "JSON Lines" in err
