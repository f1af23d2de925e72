"""A config field's type says which values it takes, and `coerce` reads a value into that type.

- `Literal[...]`: a fixed set of choices, read from the type (`typing.get_args`), e.g. `Schedule`.
- `Annotated[str, Registry(NAMES)]`: the names of a registry, read when a value is checked, so an
  estimator or loss registered later is a valid choice (`AdvantageEstimator`, `PolicyLossName`).
- bool, int, float, str, `list[X]`, `tuple[X, Y]` and `X | None` are checked as such.

A field's choices come from its own annotation only: `policy_optim.schedule` has the choices of
`OptimConfig.schedule` because it is one, not because its key ends like another key.
"""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from rlhf.config.errors import ConfigError
from rlhf.core.advantages import ESTIMATORS
from rlhf.core.losses import POLICY_LOSSES


@dataclass(frozen=True)
class Registry:
    """`Annotated` metadata: the choices of a str field are the current keys of `names`."""

    names: Mapping[str, Any]


# Choice types shared by several groups (the others are written on their field).
# rlhf.models.precision.PRECISIONS: "auto" (bfloat16 on a CUDA GPU, float32 on the CPU) | "float32" |
# "bfloat16" (autocast over float32 weights) | "bfloat16-pure" (bfloat16 weights and optimizer state)
Dtype = Literal["auto", "float32", "bfloat16", "bfloat16-pure"]
DataFormat = Literal["auto", "prompt", "sft", "messages", "pairs", "hh"]  # "auto" + rlhf.data.formats
# "auto": render HH dialogues and messages with the tokenizer's chat template when it has one
# (responses then end with its end-of-turn token) | true: require one | false: verbatim text
ChatTemplate = Literal["auto", True, False]
# "template": the chat template's own default system prompt stays when the data has no system
# message | "none": dropped (rlhf/data/tokenize.py; SmolLM2's costs ~30 prompt tokens)
SystemPrompt = Literal["template", "none"]
Sampling = Literal["custom", "paper"]  # "paper": the PPO paper §6.1 sampling (PAPER_SAMPLING)
KLEstimator = Literal["k1", "k2", "k3"]  # docs/algorithms.md §7
AdvantageEstimator = Annotated[str, Registry(ESTIMATORS)]  # rlhf.core.advantages
PolicyLossName = Annotated[str, Registry(POLICY_LOSSES)]  # rlhf.core.losses


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config class, `Annotated` metadata kept (read once per class:
    resolving them is most of the cost of reading a config)."""
    return typing.get_type_hints(cls, include_extras=True)


def is_group(tp: Any) -> bool:
    """A field whose type is itself a config dataclass (a nested group)."""
    return isinstance(tp, type) and hasattr(tp, "__dataclass_fields__")


def choices(tp: Any) -> tuple | None:
    """The allowed values of a field of type `tp`, or None when it is not a choice field."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return typing.get_args(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        registry = next((m for m in meta if isinstance(m, Registry)), None)
        return tuple(registry.names) if registry is not None else choices(base)
    if origin in (typing.Union, types.UnionType):
        found = [choices(a) for a in typing.get_args(tp) if a is not type(None)]
        return found[0] if len(found) == 1 else None
    return None


def flag_value(value: Any) -> str:
    """`value` as it is written after `--key` on the command line."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value)).replace(" ", "")
    return str(value)


def _choice_text(value: Any) -> str:
    return repr(value) if isinstance(value, str) else flag_value(value)


def coerce(tp: Any, value: Any, key: str, origin: str, example: Any = None, within: str = "") -> Any:
    """`value` (from YAML or the command line) as a value of type `tp` for the field `key`; else a
    ConfigError naming where it came from, the key, the value and a fix (`example`: a valid value;
    `within`: the declared range of a number, said with the type, e.g. "in [0, 1)")."""

    def bad(expected: str, fix: Any = example) -> ConfigError:
        if within and expected in ("an integer", "a number", "a finite number"):
            expected = f"{expected} {within}"
        hint = f"--{key} {flag_value(fix)}" if fix is not None else f"give {key} {expected}"
        return ConfigError(f"{origin}: {key} must be {expected}, got {value!r}. Fix: {hint}.", key)

    allowed = choices(tp)
    if allowed is not None and (value is not None or not _optional(tp)):
        if not any(value == c and type(value) is type(c) for c in allowed):
            fix = example if example in allowed else allowed[0]
            raise bad("one of " + ", ".join(_choice_text(c) for c in allowed), fix)
        return value
    origin_tp, args = typing.get_origin(tp), typing.get_args(tp)
    if origin_tp is Annotated:
        return coerce(args[0], value, key, origin, example, within)
    if origin_tp in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(inner[0], value, key, origin, example, within)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer", example if isinstance(example, int) else None)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; the flags read it as a number
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            value = number if math.isfinite(number) else value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number", example if isinstance(example, (int, float)) else None)
        if not math.isfinite(float(value)):  # `--kl.beta inf`, `--optim.lr 1e400`: no setting means it
            raise bad("a finite number", example if isinstance(example, (int, float)) else None)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad("a string", example if isinstance(example, str) and example else None)
        return value
    if origin_tp is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise bad("a list", example if isinstance(example, list) and example else None)
        return [coerce(args[0], v, key, origin) for v in value]
    if origin_tp is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad(f"a list of {len(args)} numbers")
        return tuple(coerce(a, v, key, origin) for a, v in zip(args, value))
    return value


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
