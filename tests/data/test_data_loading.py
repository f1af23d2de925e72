"""Reading files (JSON Lines, JSON, gzip, Parquet, hub), bad records, skipping, and splitting."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlhf.data import DataError, PromptExample, SFTExample, load_examples, split_examples
from rlhf.data.errors import Source
from rlhf.data.loading import detect_file_format, scan_examples

ROWS = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(3)]
EXPECTED = [SFTExample(f"q{i}", f"a{i}") for i in range(3)]


def jsonl_text(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_jsonl_gz(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(jsonl_text(ROWS))
    assert load_examples(path, "sft").examples == EXPECTED


def test_jsonl_with_bom_and_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\ufeff" + json.dumps(ROWS[0]) + "\n\n  \n" + jsonl_text(ROWS[1:])).encode())
    result = load_examples(path, "sft")
    assert result.examples == EXPECTED
    assert [e.source.line for e in result.examples] == [1, 4, 5]  # blank lines keep the numbering


def test_json_list_reports_the_line_each_item_starts_on(tmp_path):
    path = tmp_path / "d.json"
    rows = [ROWS[0], {"prompt": "q1"}, ROWS[2]]
    path.write_text(json.dumps(rows, indent=2))
    second_item_line = json.dumps(rows, indent=2).splitlines().index("  {", 1 + 3) + 1
    assert second_item_line == 6
    result = load_examples(path, "sft", skip_invalid=True)
    assert [e.source.line for e in result.examples] == [2, 9]
    assert str(result.errors[0]).startswith(f"{path}:6: missing field 'completion'")


def test_json_data_object_and_single_line_json(tmp_path):
    path = tmp_path / "d.json"
    text = json.dumps({"meta": {"data": [1], "n": [1, {"x": "]"}]}, "version": 2, "data": ROWS}, indent=1)
    path.write_text(text)
    result = load_examples(path, "sft")
    assert result.examples == EXPECTED
    assert result.examples[0].source.line == text.splitlines().index("  {") + 1
    path.write_text(json.dumps(ROWS))  # everything on line 1
    assert [e.source.line for e in load_examples(path, "sft").examples] == [1, 1, 1]


def test_json_file_holding_json_lines_is_read_as_json_lines(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(jsonl_text(ROWS))
    assert load_examples(path, "sft").examples == EXPECTED


def test_json_syntax_error_and_wrong_top_level(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n {"prompt": "a"},\n {"prompt": }\n]')
    with pytest.raises(DataError, match=r"d\.json:3: invalid JSON: Expecting value"):
        load_examples(path, "prompt")
    path.write_text(json.dumps({"rows": ROWS}))
    with pytest.raises(
        DataError, match=r"d\.json: a \.json file must hold a list of records .* with keys \['rows'\]"
    ):
        load_examples(path, "sft")


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    rows = [*ROWS, {"prompt": "q3", "response": None}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = load_examples(path, "sft", skip_invalid=True)
    assert result.examples == EXPECTED
    assert result.examples[2].source == Source(str(path), 3, "row")
    assert str(result.errors[0]).startswith(f"{path}:row 4: field 'response' is null")


def test_messages_from_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    pq.write_table(pa.Table.from_pylist([{"messages": messages}]), path)
    assert load_examples(path, "sft").examples == [SFTExample(messages[:1], "yo")]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + '\n{"prompt": "q1", "response": \n' + json.dumps(ROWS[2]) + "\n")
    with pytest.raises(DataError) as info:
        load_examples(path, "sft")
    assert str(info.value).startswith(f"{path}:2: invalid JSON: Expecting value (column 30). Fix: ")
    assert (info.value.file, info.value.line) == (str(path), 2)


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: the line is not valid UTF-8"):
        load_examples(path, "prompt")


def test_skip_invalid_counts_and_keeps_reasons(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [
        json.dumps(ROWS[0]),
        "{oops",
        json.dumps({"prompt": "q", "response": 5}),
        json.dumps(ROWS[1]),
        json.dumps({"prompt": "q", "response": ""}),
        json.dumps(ROWS[2]),
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r":2: invalid JSON"):
        load_examples(path, "sft")
    result = load_examples(path, "sft", skip_invalid=True)
    assert result.examples == EXPECTED
    assert result.skipped == 3
    assert [e.line for e in result.errors] == [2, 3, 5]
    summary = result.skipped_summary(limit=2)
    assert summary.splitlines()[0] == f"3 invalid record(s) skipped in {path}:"
    assert f"{path}:3: field 'response' must be a string" in summary
    assert summary.splitlines()[-1] == "  ... and 1 more"


def test_auto_detection_skips_a_bad_first_line_and_explains_later_mismatches(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("{bad\n" + jsonl_text([ROWS[0], {"prompt": "q", "chosen": "c", "rejected": "r"}]))
    result = load_examples(path, "sft", skip_invalid=True)
    assert result.format == "sft" and result.examples == EXPECTED[:1]
    assert result.skipped == 2
    # the pairs record has no response: the error says where the format came from
    assert str(result.errors[1]).startswith(f"{path}:3: missing field 'completion'")
    assert f"the format was detected from {path}:2" in str(result.errors[1])


def test_every_record_invalid(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("{bad\n[1]\n")
    with pytest.raises(
        DataError, match=r"no valid example: all 2 records are invalid; the first: .*:1: invalid JSON"
    ):
        load_examples(path, "sft", skip_invalid=True)
    assert scan_examples(path, "sft").skipped == 2  # the scanner lists them instead


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DataError) as info:
        load_examples(path, "prompt")
    assert (
        str(info.value)
        == f"{path}: the file holds no records (it is empty). Fix: "
        + 'write one JSON object per line, e.g. {"prompt": "..."}'
    )
    with pytest.raises(DataError, match="empty"):
        detect_file_format(path)


def test_missing_file_directory_and_unknown_suffix(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file\. Fix: check the path"):
        load_examples(tmp_path / "nope.jsonl", "prompt")
    with pytest.raises(DataError, match="is a directory"):
        load_examples(tmp_path, "prompt")
    (tmp_path / "d.csv").write_text("prompt\nq\n")
    with pytest.raises(DataError, match=r"unknown file type '\.csv'"):
        load_examples(tmp_path / "d.csv", "prompt")


def test_truncated_gzip(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_text(ROWS * 50).encode())[:60])
    with pytest.raises(DataError, match="gzip-compressed and its compressed data is damaged or cut short"):
        load_examples(path, "sft")


def test_bad_arguments_are_programming_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(jsonl_text(ROWS))
    with pytest.raises(ValueError, match="kind must be one of"):
        load_examples(path, "pairs")
    with pytest.raises(ValueError, match="format must be 'auto' or one of"):
        load_examples(path, "sft", format="csv")


# --- hub ------------------------------------------------------------------------------------------


def test_hub_dataset_rows(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    result = load_examples("hub:someone/prefs:test", "sft")
    assert result.examples == EXPECTED
    assert str(result.examples[1].source) == "hub:someone/prefs:test:row 2"
    assert load_examples("someone/prefs", "prompt").examples[0] == PromptExample(
        "q0"
    )  # a hub-like missing path
    assert calls == [("someone/prefs", "test"), ("someone/prefs", "train")]


def test_hub_errors_are_wrapped(monkeypatch):
    import datasets

    def failing(name, split):
        raise FileNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", failing)
    with pytest.raises(
        DataError, match=r"hub:x/y:train: could not load the hub dataset \(FileNotFoundError: .*Fix: check"
    ):
        load_examples("hub:x/y", "prompt")


def test_hub_offline_fails_fast(monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("must not be called offline"))
    with pytest.raises(DataError, match="not a local file, and the Hugging Face hub is offline"):
        load_examples("someone/prefs", "prompt")
    with pytest.raises(DataError, match="no such file"):  # a path with a data suffix is never a hub id
        load_examples("someone/prefs.jsonl", "prompt")


# --- split ----------------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_ordered():
    examples = [PromptExample(f"p{i}") for i in range(100)]
    train, test = split_examples(examples, 0.2, seed=3)
    assert len(test) == 20 and len(train) == 80
    assert sorted(e.prompt for e in train + test) == sorted(e.prompt for e in examples)
    assert [e.prompt for e in train] == [e.prompt for e in examples if e not in test]  # original order
    assert split_examples(examples, 0.2, seed=3) == (train, test)
    assert split_examples(examples, 0.2, seed=4)[1] != test


def test_split_keeps_examples_of_one_prompt_together():
    examples = [SFTExample(f"p{i // 3}", f"r{i}") for i in range(30)]  # 10 prompts, 3 examples each
    train, test = split_examples(examples, 0.3, seed=0)
    assert len(test) == 9
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    _, ungrouped = split_examples(examples, 0.3, seed=0, group_by_prompt=False)
    assert len(ungrouped) == 9


def test_split_edge_cases():
    two = [PromptExample("a"), PromptExample("b")]
    train, test = split_examples(two, 0.01)
    assert len(train) == 1 and len(test) == 1  # a positive fraction gives a non-empty test part
    assert split_examples(two, 0.0) == (two, [])
    same = [PromptExample("a"), PromptExample("a")]
    assert split_examples(same, 0.5) == (same, [])  # one group cannot be split
    with pytest.raises(ValueError, match="test_fraction"):
        split_examples(two, 1.0)


def test_path_objects_and_strings_agree(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(jsonl_text(ROWS))
    assert load_examples(str(path), "sft").examples == load_examples(Path(path), "sft").examples
