"""The helpers of the rules a config group's `validate(prefix)` holds beyond its declarations: a key's
range and the condition it applies under are declared beside its field (rlhf/config/keys.py) and
checked from there; what is left here ties several keys together.

A group checks its own fields in `validate(self, prefix)`, where `prefix` is the group's dotted place
in the stage config ("policy_optim." for RLConfig's policy optimizer), so each message names the
full key, the value given and a fix that works on the command line. A stage config's `validate`
calls its groups' (`validate_groups`) and then checks what ties several groups together.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from rlhf.config.errors import ConfigError

logger = logging.getLogger("rlhf.config")  # warnings for legal values that are almost surely mistakes


def require(ok: bool, key: str, value: Any, rule: str, fix: str) -> None:
    """Raise "KEY RULE, got VALUE. Fix: FIX." unless `ok`."""
    if not ok:
        raise ConfigError(f"{key} {rule}, got {value!r}. Fix: {fix}.", key)


def required(value: Any, key: str, fix: str) -> None:
    """A setting without a default (a model directory, a data file) is given."""
    if not value:
        raise ConfigError(f"{key} is missing. Fix: {fix}.", key)


def at_least(value: Any, low: Any, key: str, why: str = "") -> None:
    """`value` >= `low` (`why`: what the key counts, or what its lowest value means)."""
    require(value >= low, key, value, f"must be >= {low}{why}", f"--{key} {low} or more")


def refuse(message: str, key: str) -> None:
    """A rule over several keys: `message` names each of them and the fix; `key` is the one refused."""
    raise ConfigError(message, key)


def warn(message: str, *args: Any) -> None:
    logger.warning(message, *args)


DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")  # rlhf.models.device.resolve_device reads these


def device_names(config: Any, prefix: str = "") -> None:
    """Every `device` field of `config`, at any depth, names a device ("auto", "cpu", "cuda", "cuda:N");
    whether this machine has it is asked when the command starts (rlhf.models.device)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            device_names(value, f"{prefix}{f.name}.")
        elif f.name == "device" and isinstance(value, str):
            text = value.strip().lower()
            require(
                DEVICE_NAME.fullmatch(text) is not None,
                f"{prefix}device",
                value,
                "must be one of auto, cpu, cuda, cuda:N",
                f"--{prefix}device auto",
            )


def validate_groups(config: Any, prefix: str) -> None:
    """`validate(prefix + name + ".")` of every field of `config` that is a group with rules."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and hasattr(value, "validate"):
            value.validate(f"{prefix}{f.name}.")
