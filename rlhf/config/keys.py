"""Where each config key is valid, declared once beside its field.

    beta: float = setting(0.1, "(0, 100]")  # strength of the reference anchor ...
    max_turns: int = setting(4, ">= 1", unit="turns", when=When("name", "set", says="--env MODULE:Class"))

`setting` is `dataclasses.field` with a `Spec` in its metadata: the key's range (`Range`), its unit
and the conditions under which it applies (`When`). From it come `check_ranges(config)` (a value
outside its range or non-finite is refused), `refuse_inapplicable(config, layers)` (a key set
explicitly where it cannot apply is refused; a preset's or default's value stays silent) and
`describe(cls)` (the rows of `rlhf config STAGE`, the doc read from the comment beside the field)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import math
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlhf.config.errors import ConfigError
from rlhf.config.fields import choices, flag_value, is_group, type_hints

SPEC = "rlhf"  # the metadata key of a field's Spec

_INTERVAL = re.compile(r"([\[(])\s*(\S+?)\s*,\s*(\S+?)\s*([\])])")
_HALF = re.compile(r"(>=|>|<=|<)\s*(\S+)")


@dataclass(frozen=True)
class Range:
    """The values a numeric key means something for: "> 0", ">= 1", "<= 1", "[0, 1)", "(0, 1]", or
    "any" (every finite number; `why` says what a number of either sign means)."""

    text: str
    why: str = ""

    @functools.cached_property
    def bounds(self) -> tuple[float, bool, float, bool]:
        """(low, low inclusive, high, high inclusive)."""
        text = self.text.strip()
        if text == "any":
            return -math.inf, False, math.inf, False
        interval = _INTERVAL.fullmatch(text)
        if interval:
            a, low, high, b = interval.groups()
            return float(low), a == "[", float(high), b == "]"
        half = _HALF.fullmatch(text)
        if not half:
            raise ValueError(f"not a range: {text!r}")
        op, number = half.group(1), float(half.group(2))
        if op.startswith(">"):
            return number, op == ">=", math.inf, False
        return -math.inf, False, number, op == "<="

    def contains(self, value: float) -> bool:
        low, low_in, high, high_in = self.bounds
        if not math.isfinite(value):
            return False
        above = value >= low if low_in else value > low
        below = value <= high if high_in else value < high
        return above and below

    def words(self) -> str:
        """The rule as the messages say it: "> 0", ">= 1", "in [0, 1)", "any finite number"."""
        if self.text == "any":
            return "any finite number"
        return self.text if _HALF.fullmatch(self.text.strip()) else f"in {self.text}"

    def example(self, integer: bool) -> float | int:
        """A value inside the range (for a fix when the key has no usable default)."""
        low, low_in, high, high_in = self.bounds
        if math.isfinite(low) and math.isfinite(high):
            value: float = low if low_in else high if high_in else (low + high) / 2
        elif math.isfinite(low):
            value = low if low_in else low + 1
        elif math.isfinite(high):
            value = high if high_in else high - 1
        else:
            value = 0
        return int(math.ceil(value)) if integer else value

    def outside(self, integer: bool) -> list[float]:
        """Values just outside the range (the generated tests try each)."""
        low, low_in, high, high_in = self.bounds
        step = 1 if integer else 1e-3
        found = []
        if math.isfinite(low):
            found.append(low - step if low_in else low)
        if math.isfinite(high):
            found.append(high + step if high_in else high)
        return [int(v) for v in found] if integer else found


@dataclass(frozen=True)
class When:
    """A condition under which a key applies. `key`: dotted, relative to the group that declares
    it (a sibling), or to the stage config with `root`. `test`: a value the key must equal, a tuple
    of them, "set" (non-empty, not null), "> N", or a callable of the value; `says`: how the
    condition reads in messages (default: "KEY VALUE"); `fix`: how to meet it (default: --KEY VALUE)."""

    key: str
    test: Any
    root: bool = False
    says: Any = ""  # str (with "{key}"), or a callable of the key
    fix: str = ""
    example: Any = "x"  # a value meeting a "set" or callable test (`meeting`)

    def meeting_value(self) -> Any:
        """A value of the key that meets the condition."""
        test = self.test
        if test == "set" or callable(test):
            return self.example
        if isinstance(test, str) and test.startswith(">"):
            return int(float(test[1:])) + 1
        return test[0] if isinstance(test, tuple) else test

    def holds(self, value: Any) -> bool:
        test = self.test
        if callable(test):
            return bool(test(value))
        if test == "set":
            return bool(value)
        if isinstance(test, str) and test.startswith(">"):
            return isinstance(value, (int, float)) and value > float(test[1:])
        if isinstance(test, tuple):
            return any(value == t and type(value) is type(t) for t in test)
        return value == test and type(value) is type(test)

    def words(self, prefix: str) -> str:
        key = self.key if self.root else prefix + self.key
        if callable(self.says):  # read when the message is made (a registry that grows)
            return str(self.says(key))
        if self.says:
            return self.says.format(key=key)
        test = self.test
        if test == "set":
            return f"{key} is set"
        if isinstance(test, str) and test.startswith(">"):
            return f"{key} > {test[1:].strip()}"
        if isinstance(test, tuple):
            return f"{key} is one of {', '.join(flag_value(t) for t in test)}"
        return f"{key} {flag_value(test)}"

    def remedy(self, prefix: str) -> str:
        key = self.key if self.root else prefix + self.key
        if self.fix:
            return self.fix.format(key=key)
        test = self.test
        if isinstance(test, tuple):
            return f"--{key} {flag_value(test[0])}"
        if isinstance(test, str) and test.startswith(">"):
            return f"--{key} {int(float(test[1:])) + 1} (or more)"
        if test == "set" or callable(test):
            return f"set --{key}"
        return f"--{key} {flag_value(test)}"


@dataclass(frozen=True)
class Spec:
    range: Range | None = None
    unit: str = ""
    when: tuple[When, ...] = ()


def setting(
    default: Any = dataclasses.MISSING,
    range: str | Range | None = None,  # noqa: A002 (the word of the declaration)
    *,
    factory: Callable[[], Any] | None = None,
    unit: str = "",
    when: When | tuple[When, ...] = (),
    why: str = "",
) -> Any:
    """A dataclass field with its declaration (see the module doc); typed Any so that
    `x: float = setting(0.1, "> 0")` reads as a default to mypy."""
    rng = Range(range, why) if isinstance(range, str) else range
    spec = Spec(rng, unit, when if isinstance(when, tuple) else (when,))
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={SPEC: spec})
    return dataclasses.field(default=default, metadata={SPEC: spec})


def spec_of(f: dataclasses.Field) -> Spec:
    return f.metadata.get(SPEC) or Spec()


def numeric_kind(tp: Any) -> type | None:
    """int or float for a numeric field (`int | None` too), else None (bool is not a number here)."""
    if choices(tp) is not None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return numeric_kind(args[0])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return numeric_kind(inner[0]) if len(inner) == 1 else None
    return tp if tp in (int, float) else None


def optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


# -- ranges -------------------------------------------------------------------------------------------


def range_message(key: str, value: Any, f: dataclasses.Field, tp: Any, default: Any) -> str:
    spec = spec_of(f)
    assert spec.range is not None
    integer = numeric_kind(tp) is int
    unit = f" ({spec.unit})" if spec.unit else ""
    null = ", or null" if optional(tp) else ""
    why = f" ({spec.range.why})" if spec.range.why else ""
    fix = default if _usable(default, spec.range) else spec.range.example(integer)
    return (
        f"{key} must be {spec.range.words()}{unit}{null}{why}, got {value!r}. Fix: --{key} {flag_value(fix)}."
    )


def _usable(value: Any, rng: Range) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and rng.contains(value)


def check_ranges(config: Any, prefix: str = "") -> None:
    """Every numeric key of `config`, at every depth, within its declared range (null where the type
    allows it); else a ConfigError naming the key, its bound and a fix."""
    hints = type_hints(type(config))
    for f in dataclasses.fields(config):
        value, tp = getattr(config, f.name), hints[f.name]
        if is_group(tp):
            check_ranges(value, f"{prefix}{f.name}.")
            continue
        rng = spec_of(f).range
        if rng is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not rng.contains(value):
            default = f.default if f.default is not dataclasses.MISSING else None
            raise ConfigError(range_message(f"{prefix}{f.name}", value, f, tp, default), f"{prefix}{f.name}")


# -- conditions ---------------------------------------------------------------------------------------


def lookup(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def conditions(cls: type, dotted: str) -> list[tuple[When, str]]:
    """The conditions of the key `dotted` of stage class `cls` and of each group around it, with the
    prefix each is read under."""
    found = []
    node, prefix = cls, ""
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            break
        found.extend((w, prefix) for w in spec_of(fields[part]).when)
        tp = type_hints(node)[part]
        if not is_group(tp):
            break
        node, prefix = tp, f"{prefix}{part}."
    return found


def meeting(cls: type, dotted: str) -> dict[str, Any]:
    """{dotted key: value} that meet every condition of the key `dotted` of stage class `cls`."""
    return {(w.key if w.root else prefix + w.key): w.meeting_value() for w, prefix in conditions(cls, dotted)}


def unmet(config: Any, dotted: str) -> tuple[When, str, Any] | None:
    """The first condition of `dotted` that `config` does not meet: (condition, prefix, the value
    its key has), or None."""
    for when, prefix in conditions(type(config), dotted):
        where = when.key if when.root else prefix + when.key
        value = lookup(config, where)
        if not when.holds(value):
            return when, prefix, value
    return None


def leaf_keys(data: Any, prefix: str = "") -> Iterator[str]:
    """The dotted keys a nested dict names (an empty group names none)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, dict):
                yield from leaf_keys(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"


def refuse_inapplicable(config: Any, layers: list[tuple[str, dict | None]]) -> None:
    """A key set explicitly (`layers`: (origin, nested dict) of a --config file and the command line)
    whose condition `config` does not meet: a ConfigError naming the origin, the key, the condition
    and the fix. Keys a preset or a default set are not in `layers`, so they stay silent."""
    for origin, data in layers:
        for dotted in leaf_keys(data or {}):
            found = unmet(config, dotted)
            if found is None:
                continue
            when, prefix, value = found
            where = when.key if when.root else prefix + when.key
            drop = f"drop --{dotted}" if origin == "command line" else f"remove {dotted} from {origin}"
            raise ConfigError(
                f"{origin}: {dotted} applies only when {when.words(prefix)}, and {where} is "
                f"{flag_value(value)}: the setting would do nothing. Fix: {when.remedy(prefix)}, or {drop}.",
                dotted,
            )


# -- the listing --------------------------------------------------------------------------------------


@dataclass
class KeyRow:
    key: str
    type: str
    default: Any
    range: str
    when: str
    doc: str


def type_text(tp: Any) -> str:
    allowed = choices(tp)
    if allowed is not None:
        text = " | ".join(flag_value(c) for c in allowed)
        return text + (" | null" if optional(tp) else "")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args if a is not type(None)) + " | null"
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def describe(config: Any, prefix: str = "") -> list[KeyRow]:
    """A row per key of `config` (an instance: its values are the defaults shown), at every depth."""
    rows = []
    cls = type(config)
    hints, docs = type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(config):
        key, tp, value = f"{prefix}{f.name}", hints[f.name], getattr(config, f.name)
        spec = spec_of(f)
        when = "; ".join(w.words(prefix) for w in spec.when)
        if is_group(tp):
            inner = describe(value, f"{key}.")
            if when:
                for row in inner:
                    row.when = "; ".join(x for x in (when, row.when) if x)
            rows.extend(inner)
            continue
        rng = spec.range.words() if spec.range else ""
        if spec.unit:
            rng = f"{rng} {spec.unit}".strip()
        rows.append(KeyRow(key, type_text(tp), value, rng, when, docs.get(f.name, "")))
    return rows


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its comment} for `cls` and the classes it inherits fields from: the comment on the
    field's own lines, else the comment lines right above it, joined."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not cls.__mro__[-1]:
            docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for node in body.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        end = node.end_lineno or node.lineno
        own = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        if not own:
            line = node.lineno - 1
            while line in comments and line not in code_lines:
                own.insert(0, comments[line])
                line -= 1
        docs[node.target.id] = " ".join(own)
    return docs
