"""What comes from outside the process, read once by one function each: JSON text (data files,
prompt files, reward-server bodies) and numbers (environment rewards, reward-server scores,
reward-function values).

JSON is read as RFC 8259 asks of interoperable text: an object whose names are not unique is
refused (`json.loads` keeps the last value silently), naming the key and the line it is repeated on.
A number from outside is checked after the cast it must survive: a float32 reward of 1e39 is inf,
so it is refused where it enters, naming its source, instead of failing later far from it.
"""

from __future__ import annotations

import json
import math
import numbers
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max


class JSONInputError(ValueError):
    """Text that is not JSON as the specification reads it. `line` and `column`: 1-based, of the
    text given; `key`: the repeated name of a duplicated key (None for other errors)."""

    def __init__(self, reason: str, line: int, column: int, key: str | None = None):
        super().__init__(f"{reason} (line {line}, column {column})")
        self.reason, self.line, self.column, self.key = reason, line, column, key


class _Duplicate(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


_FAST = json.JSONDecoder(object_pairs_hook=_unique)


def loads(text: str | bytes) -> Any:
    """`text` as JSON, every object's keys unique; JSONInputError naming the line otherwise (a
    syntax error, a duplicated key, nesting too deep to read, an integer too long to convert)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise JSONInputError(f"byte {err.start} is not UTF-8", 1, err.start + 1) from None
    try:
        return _FAST.decode(text)
    except _Duplicate:
        raise _locate_duplicate(text) from None
    except json.JSONDecodeError as err:
        raise JSONInputError(err.msg, err.lineno, err.colno) from None
    except RecursionError:
        raise JSONInputError("the JSON is nested too deeply to read", 1, 1) from None
    except ValueError as err:  # an integer of more digits than int() converts
        raise JSONInputError(f"a number that cannot be read ({err})", 1, 1) from None


def raw_decode(text: str, index: int) -> tuple[Any, int]:
    """One JSON value of `text` starting at `index` and where it ends (`JSONDecoder.raw_decode`),
    keys unique; JSONInputError with the line and column in `text`."""
    try:
        return _FAST.raw_decode(text, index)
    except _Duplicate:
        raise _locate_duplicate(text, index) from None
    except json.JSONDecodeError as err:
        raise JSONInputError(err.msg, err.lineno, err.colno) from None
    except RecursionError:
        raise JSONInputError("the JSON is nested too deeply to read", *_line_column(text, index)) from None
    except ValueError as err:
        raise JSONInputError(f"a number that cannot be read ({err})", *_line_column(text, index)) from None


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


def _locate_duplicate(text: str, index: int = 0) -> JSONInputError:
    """The error of the first object (innermost first, as parsing completes them) with a repeated
    key, at the repeated key: a second, slower parse that knows where each object starts."""
    decoder = json.JSONDecoder()
    found: list[JSONInputError] = []

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        pairs, end = JSONObject(s_and_end, strict, scan_once, None, list, memo)
        if not found:
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    line, column = _line_column(text, _key_position(text, s_and_end[1], key))
                    found.append(
                        JSONInputError(f"key {key!r} is given twice in one object", line, column, key)
                    )
                    break
                seen.add(key)
        return dict(pairs), end

    decoder.parse_object = parse_object  # type: ignore[method-assign]
    decoder.scan_once = py_make_scanner(decoder)
    try:
        decoder.raw_decode(text, index)
    except (ValueError, RecursionError):  # the fast parse read it: only this one's limits differ
        pass
    return found[0] if found else JSONInputError("a key is given twice in one object", 1, 1)


def _key_position(text: str, start: int, wanted: str) -> int:
    """Where the second `wanted` key of the object whose members start at `start` begins."""
    plain = json.JSONDecoder()
    index, seen = start, False
    while True:
        index = _skip(text, index)
        if text[index] == "}":
            return start
        key_at = index
        key, index = plain.raw_decode(text, index)
        if key == wanted:
            if seen:
                return key_at
            seen = True
        index = _skip(text, _skip(text, index) + 1)  # past ":"
        _, index = plain.raw_decode(text, index)
        index = _skip(text, index)
        if text[index] == ",":
            index += 1


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def outside_number(
    value: object, said: str, fix: str, error: type[ValueError], after: str = "", context: str = ""
) -> float:
    """`value` as a float that float32 (the dtype rewards and losses are computed in) holds finitely;
    otherwise `error` reading "{said} {value}{after}, {why}{context}. Fix: {fix}." (bools are not
    numbers)."""
    shown = f"{said} {_shown(value)}{after}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{shown}, not a number ({type(value).__name__}){context}. Fix: {fix}.")
    try:
        number = float(value)
    except (OverflowError, ValueError):  # an int beyond float64
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) or (math.isinf(number) and not isinstance(value, int)):
        raise error(f"{shown}, not a finite number{context}. Fix: {fix}.")
    if abs(number) > FLOAT32_MAX:
        raise error(
            f"{shown}, beyond float32 (the dtype rewards are computed in: at most {FLOAT32_MAX:.3g} in "
            f"size){context}. Fix: {fix}."
        )
    return number


def _shown(value: object) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        text = repr(float(value))
    else:
        text = repr(value)
    digits = len(text.lstrip("-"))
    if isinstance(value, numbers.Integral) and digits > 24:  # 10**400: its size, not 400 digits
        return f"{text[:8]}... (an integer of {digits} digits)"
    return text[:200]
