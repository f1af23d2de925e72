"""Load examples from local files or the Hugging Face hub, and split them into train and test.

Sources: `.jsonl` (one object a line), `.json` (a list of objects, or {"data": [...]}; a `.json`
file that is really JSON Lines is read as such), either of them gzipped (`.gz`), `.parquet`,
and hub datasets (`hub:NAME` or `hub:NAME:SPLIT`; a path that does not exist but looks like
`owner/name` is tried on the hub too, unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set).

Every record keeps its `Source` (file and line, or row), so each problem is reported as
"FILE:LINE: what is wrong. Fix: ...". `skip_invalid=True` drops bad records and counts them.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.config.outside import JSONInputError
from rlhf.config.outside import loads as read_json
from rlhf.data.errors import DataError, Source
from rlhf.data.examples import KINDS, Example, prompt_key
from rlhf.data.formats import FORMATS, detect_format, parse_record

FILE_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")
logger = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_EMPTY_FIX = 'write one JSON object per line, e.g. {"prompt": "..."}'
_SKIP_FIX = "fix or remove the line, or skip bad records (--skip-invalid; in Python skip_invalid=True)"


@dataclass
class LoadResult:
    """The examples read from one source, the format they were read as, and the records skipped."""

    examples: list[Example]
    format: str
    path: str
    errors: list[DataError] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """How many records were invalid (and skipped)."""
        return len(self.errors)

    def skipped_summary(self, limit: int = 5) -> str:
        """ "N records skipped" and the first `limit` reasons, one a line ("" when none were skipped)."""
        if not self.errors:
            return ""
        lines = [f"{self.skipped} invalid record(s) skipped in {self.path}:"]
        lines += [f"  {error}" for error in self.errors[:limit]]
        if self.skipped > limit:
            lines.append(f"  ... and {self.skipped - limit} more")
        return "\n".join(lines)


def load_examples(
    path: str | os.PathLike, kind: str, format: str = "auto", skip_invalid: bool = False
) -> LoadResult:
    """Read every example of `kind` ("prompt" | "sft" | "preference") from `path`.

    `format` is "auto" (detected from the first valid record) or one of `formats.FORMATS`.
    Raises `DataError` at the first invalid record unless `skip_invalid`, and always when no
    valid example remains (an empty file, or every record invalid).
    """
    result = LoadResult(examples=[], format=format, path=str(path))
    for item in _parse_all(path, kind, format, result):
        if isinstance(item, DataError):
            if not skip_invalid:
                raise item
            result.errors.append(item)
        else:
            result.examples.append(item)
    _require_examples(result)
    if result.errors:
        logger.warning(result.skipped_summary())  # skipping is never silent: how many, and why
    return result


def scan_examples(path: str | os.PathLike, kind: str, format: str = "auto") -> LoadResult:
    """Like `load_examples(..., skip_invalid=True)`, but an empty result is not an error.

    For validators that list every bad record (`rlhf data check --all-errors`). Problems with the
    file as a whole (missing, unreadable, not JSON) still raise `DataError`.
    """
    result = LoadResult(examples=[], format=format, path=str(path))
    for item in _parse_all(path, kind, format, result):
        (result.errors if isinstance(item, DataError) else result.examples).append(item)
    return result


def detect_file_format(path: str | os.PathLike) -> str:
    """The format of a file, detected from its first record that is a JSON value (as "auto" does).

    Raises the `DataError` of that record when its keys match no format, or a file-level
    `DataError` when no record parses at all.
    """
    first_error: DataError | None = None
    for source, record in _records(path):
        if isinstance(record, DataError):
            first_error = first_error or record
            continue
        return detect_format(record, source)
    if first_error is not None:
        raise DataError(
            Source(str(path)),
            f"no record could be read, so the format is unknown; the first problem: "
            f"{first_error.source}: {first_error.problem}",
            first_error.fix,
        )
    raise DataError(Source(str(path)), "the file holds no records (it is empty)", _EMPTY_FIX)


def split_examples(
    examples: list[Example], test_fraction: float, seed: int = 0, group_by_prompt: bool = True
) -> tuple[list[Example], list[Example]]:
    """A deterministic (train, test) split; each part keeps the original order.

    With `group_by_prompt`, examples sharing a prompt land on the same side (HH has many pairs per
    prompt; splitting them apart leaks test prompts into training), so the test part holds about
    `test_fraction` of the examples. With 0 < test_fraction < 1 and at least two groups, both
    parts are non-empty.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    groups: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        key = prompt_key(example.prompt) if group_by_prompt else str(index)
        groups.setdefault(key, []).append(index)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    target = round(test_fraction * len(examples))
    if test_fraction > 0 and len(keys) >= 2:
        target = max(target, 1)
    test_indices: set[int] = set()
    for key in keys[:-1]:  # the last group always stays in train
        if len(test_indices) >= target:
            break
        test_indices.update(groups[key])
    train = [e for i, e in enumerate(examples) if i not in test_indices]
    test = [e for i, e in enumerate(examples) if i in test_indices]
    return train, test


# --- parsing --------------------------------------------------------------------------------------


def _parse_all(
    path: str | os.PathLike, kind: str, format: str, result: LoadResult
) -> Iterator[Example | DataError]:
    """Parse each record; yields examples and the DataError of each bad record. Sets result.format."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    fmt = None if format == "auto" else format
    detected_at: Source | None = None
    for source, record in _records(path):
        if isinstance(record, DataError):
            yield record
            continue
        try:
            if fmt is None:
                fmt, detected_at = detect_format(record, source), source
                result.format = fmt
            yield parse_record(record, fmt, kind, source)
        except DataError as error:
            if detected_at is not None and detected_at != source and "missing field" in error.problem:
                error = DataError(
                    source, f"{error.problem}; the format was detected from {detected_at}", error.fix
                )
            yield error


def _require_examples(result: LoadResult) -> None:
    if result.examples:
        return
    if result.errors:
        raise DataError(
            Source(result.path),
            f"no valid example: all {result.skipped} records are invalid; the first: {result.errors[0]}",
            "check that the file matches one format (rlhf data check FILE --all-errors lists every problem)",
        )
    raise DataError(
        Source(result.path),
        "the file holds no records (it is empty)",
        _EMPTY_FIX,
    )


# --- reading records ------------------------------------------------------------------------------


def _records(path: str | os.PathLike) -> Iterator[tuple[Source, Any]]:
    """(source, record or DataError) for every record of the file or hub dataset."""
    text = str(path)
    if text.startswith("hub:"):
        yield from _hub_records(text[len("hub:") :])
        return
    file = Path(path)
    if not file.exists():
        if _HUB_ID.match(text) and not text.endswith(FILE_SUFFIXES):
            yield from _hub_records(text)
            return
        raise DataError(
            Source(text), "no such file", "check the path (hub datasets are named hub:OWNER/NAME)"
        )
    if file.is_dir():
        raise DataError(
            Source(text), "is a directory, not a data file", f"give one file ({', '.join(FILE_SUFFIXES)})"
        )
    name = file.name.lower()
    if name.endswith(".parquet"):
        yield from _parquet_records(file)
    elif name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        yield from _jsonl_records(file)
    elif name.endswith((".json", ".json.gz")):
        yield from _json_records(file)
    else:
        raise DataError(
            Source(text),
            f"unknown file type {file.suffix!r}",
            f"use one of {', '.join(FILE_SUFFIXES)} (a .gz of JSON or JSON Lines works too)",
        )


GZIP_MAGIC = b"\x1f\x8b"


def _open_binary(file: Path):
    """The file's bytes, gunzipped when it is gzip by its first two bytes (whatever its name says)."""
    with open(file, "rb") as handle:
        magic = handle.read(2)
    return gzip.open(file, "rb") if magic == GZIP_MAGIC else open(file, "rb")


def _not_json_lines(file: Path, line: str) -> DataError | None:
    """A file-level error when the first line shows the file is a table (CSV/TSV), not JSON Lines."""
    text = line.strip()
    if text.startswith(("{", "[", '"')) or not any(sep in text for sep in (",", "\t", ";")):
        return None
    return DataError(
        Source(str(file), 1),
        f"the file looks like CSV/TSV, not JSON Lines (first line: {text[:60]!r})",
        'convert it to JSON Lines, one object a line: {"prompt": "...", "response": "..."}',
    )


def _unreadable(file: Path, error: BaseException, line: int | None = None) -> DataError:
    """The file-level error of a file that cannot be read or decompressed (`line`: where it broke)."""
    try:
        with open(file, "rb") as handle:
            gzipped = handle.read(2) == GZIP_MAGIC
    except OSError:  # not even readable (permissions): the error says so
        gzipped = False
    if gzipped:
        return DataError(
            Source(str(file), line),
            f"the file is gzip-compressed and its compressed data is damaged or cut short ({error})",
            "check that the file is complete (download or compress it again), or give the uncompressed file",
        )
    return DataError(
        Source(str(file), line), f"cannot read the file ({error})", "check that the file is complete"
    )


def _jsonl_records(file: Path) -> Iterator[tuple[Source, Any]]:
    number = 0
    try:
        with _open_binary(file) as handle:
            for number, raw in enumerate(handle, start=1):
                source = Source(str(file), number)
                if b"\x00" in raw:  # no text file holds a NUL byte: the whole file is binary
                    raise DataError(
                        source,
                        "the file holds binary data (a NUL byte), not JSON Lines text",
                        "give a JSON Lines file saved as UTF-8 text (a gzip file works too, under any name)",
                    )
                try:
                    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    yield (
                        source,
                        DataError(source, f"the line is not valid UTF-8 ({error.reason})", _SKIP_FIX),
                    )
                    continue
                if not line.strip():
                    continue
                try:
                    record = read_json(line.rstrip("\r\n"))
                except JSONInputError as error:
                    table = _not_json_lines(file, line) if number == 1 and error.key is None else None
                    if table is not None:
                        raise table from None
                    yield source, _json_error(source, error, _SKIP_FIX)
                    continue
                yield source, record
    except (OSError, EOFError, zlib.error) as error:  # a truncated or corrupt .gz
        raise _unreadable(file, error, number + 1 if number else None) from None


def _json_records(file: Path) -> Iterator[tuple[Source, Any]]:
    """Items of a JSON list (or of {"data": [...]}) with the line each item starts on."""
    try:
        with _open_binary(file) as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as error:  # a truncated or corrupt .gz
        raise _unreadable(file, error) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(
            Source(str(file), line),
            f"not UTF-8 text (byte {error.start} is {data[error.start : error.start + 1]!r}): not a JSON file",
            "give a JSON (or JSON Lines) file saved as UTF-8; binary files are not data files",
        ) from None
    try:
        document = read_json(text)
    except JSONInputError as error:
        if error.reason == "Extra data":  # several top-level values: this is JSON Lines named .json
            yield from _jsonl_records(file)
            return
        raise _json_error(Source(str(file), error.line), error, "fix the JSON syntax") from None
    start = _skip_space(text, 0)
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        start = _value_position(text, start, "data")
    elif not isinstance(document, list):
        raise DataError(
            Source(str(file)),
            f'a .json file must hold a list of records or {{"data": [...]}}, got {type(document).__name__}'
            + (f" with keys {sorted(document)[:8]}" if isinstance(document, dict) else ""),
            "wrap the records in a list, or write JSON Lines (.jsonl, one record a line)",
        )
    yield from _array_items(text, start, str(file))


def _json_error(source: Source, error: JSONInputError, fix: str) -> DataError:
    """The DataError of text that is not JSON (a duplicated key: JSON would keep one value silently)."""
    if error.key is not None:
        return DataError(
            source,
            f"key {error.key!r} is given twice in one object (column {error.column}); JSON readers keep "
            "one of the values silently",
            f"keep one {error.key!r} per object; {fix}",
        )
    if error.reason.startswith("the JSON is nested too deeply"):
        return DataError(source, error.reason, "write the records as flat objects; " + fix)
    return DataError(source, f"invalid JSON: {error.reason} (column {error.column})", fix)


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _value_position(text: str, index: int, wanted: str) -> int:
    """Where the value of top-level key `wanted` starts, in an object starting at `index` (valid JSON)."""
    decoder = json.JSONDecoder()
    index = _skip_space(text, index + 1)  # past "{"
    while True:
        key, index = decoder.raw_decode(text, index)
        index = _skip_space(text, _skip_space(text, index) + 1)  # past ":"
        if key == wanted:  # keys are unique: read_json refused the file otherwise
            return index
        _, index = decoder.raw_decode(text, index)
        index = _skip_space(text, _skip_space(text, index) + 1)  # past ","


def _array_items(text: str, index: int, file: str) -> Iterator[tuple[Source, Any]]:
    decoder = json.JSONDecoder()
    index = _skip_space(text, index + 1)  # past "["
    line, counted_to = 1, 0
    while index < len(text) and text[index] != "]":
        line += text.count("\n", counted_to, index)
        counted_to = index
        item, index = decoder.raw_decode(text, index)
        yield Source(file, line), item
        index = _skip_space(text, index)
        if text[index] == ",":
            index = _skip_space(text, index + 1)


def _parquet_records(file: Path) -> Iterator[tuple[Source, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:  # pragma: no cover - pyarrow comes with `datasets`
        raise DataError(Source(str(file)), "reading Parquet needs pyarrow", "pip install pyarrow") from error
    try:
        table = pq.ParquetFile(file)
        row = 0
        for batch in table.iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                row += 1
                yield Source(str(file), row, "row"), record
    except (OSError, pa.ArrowException) as error:  # pyarrow's ArrowInvalid: not a Parquet file at all
        raise DataError(
            Source(str(file)),
            f"cannot read the Parquet file ({error})",
            "check that the file is complete and really Parquet (JSON data goes in a .jsonl or .json file)",
        ) from None


def _hub_offline() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_records(spec: str) -> Iterator[tuple[Source, Any]]:
    name, _, split = spec.partition(":")
    split = split or "train"
    label = f"hub:{name}:{split}"
    if _hub_offline():
        raise DataError(
            Source(label),
            "not a local file, and the Hugging Face hub is offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set)",
            "give the path of a local .jsonl/.json/.parquet file, or go online",
        )
    try:
        import datasets

        dataset = datasets.load_dataset(name, split=split)
    except Exception as error:  # datasets raises many types; all mean "could not load"
        raise DataError(
            Source(label),
            f"could not load the hub dataset ({type(error).__name__}: {error})",
            "check the dataset name and split (hub:OWNER/NAME:SPLIT) and the network, or download it to a local file",
        ) from error
    for row, record in enumerate(dataset, start=1):
        yield Source(label, row, "row"), record
