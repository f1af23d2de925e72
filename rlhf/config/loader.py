"""Reading configs: YAML presets and files, dotted command-line overrides, and building a validated stage config from them.

Layering (later wins): stage defaults < preset YAML < user YAML (`--config`) < `--a.b value` flags.
Each layer changes only the keys it names, at any depth; every other field keeps its stage default,
which for a nested group is the parent field's `default_factory` result (SFT's optimizer defaults
are not RL's), not the group class's own defaults.
Unknown keys are errors that name the key, where it came from and the nearest valid key.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from rlhf.config import presets
from rlhf.config.checks import device_names
from rlhf.config.errors import ConfigError
from rlhf.config.fields import coerce, is_group, type_hints
from rlhf.config.keys import leaf_keys, numeric_kind, refuse_inapplicable, spec_of


def parse_overrides(args: list[str]) -> dict:
    """`["--kl.beta", "0.05", "--train.iterations=20"]` -> nested dict; values parsed as YAML scalars."""
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}. Fix: overrides look like --group.key value.")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"--{key} needs a value. Fix: --{key} VALUE.")
            raw = args[i + 1]
            i += 2
        key = key.replace("-", "_")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads "1e-3" (no dot) as a string
            except ValueError:
                pass
        if isinstance(value, str) and raw.strip() == "":
            value = ""
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--{key}: {part} is set both as a value and as a group. Fix: give one.")
        node[parts[-1]] = value
    return out


def deep_merge(base: dict, top: dict) -> dict:
    """`base` with `top`'s keys replaced, at every depth (neither input changes)."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def from_dict(
    cls: type, data: dict, *, origin: str = "config", prefix: str = "", base: Any = None, _root=None
):
    """`base` (default: `cls()`, the stage defaults) with the keys `data` names replaced, keys and
    types checked. A nested group named in `data` is rebuilt over `base`'s own value of that group
    (e.g. RLConfig's `policy_optim` with lr 1e-6), so only the keys named at any depth change."""
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(
            f"{origin}: {where} must be a mapping, got {data!r}. Fix: write {where}: {{key: value}}."
        )
    if _root is None:
        _root = cls
    base = cls() if base is None else copy.deepcopy(base)  # never share lists with the caller's base
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = set(fields)
    changes = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            leaf = next(leaf_keys({key: value}, prefix), dotted)  # `--kl.beta`: kl.beta, not kl
            raise ConfigError(
                _other_stage_message(_root, leaf, origin)
                or _unknown_key_message(_root, cls, key, dotted, origin, prefix)
            )
        if is_group(hints[key]):
            changes[key] = from_dict(
                hints[key], value, origin=origin, prefix=f"{dotted}.", base=getattr(base, key), _root=_root
            )
        else:
            rng, example = spec_of(fields[key]).range, getattr(base, key)
            if rng is not None and example is None:  # an optional number: a value inside its range
                example = rng.example(numeric_kind(hints[key]) is int)
            within = rng.words() if rng else ""
            changes[key] = coerce(hints[key], value, dotted, origin, example, within)
    return dataclasses.replace(base, **changes)


def _unknown_key_message(root: type, cls: type, key: str, dotted: str, origin: str, prefix: str) -> str:
    valid = [f"{prefix}{f.name}" for f in dataclasses.fields(cls)]
    everywhere = all_keys(cls, prefix)
    close = difflib.get_close_matches(dotted, everywhere, n=1, cutoff=0.5) or difflib.get_close_matches(
        key, [k.rsplit(".", 1)[-1] for k in everywhere], n=1, cutoff=0.5
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    drop = f"drop --{dotted}, or use" if origin == "command line" else "use"
    return f"{origin}: unknown key {dotted!r}.{hint} Fix: {drop} a valid key; here: {', '.join(valid)}."


def _other_stage_message(root: type, dotted: str, origin: str) -> str | None:
    """A key of another command's config ("kl.beta is a key of `rlhf train`, not of `rlhf dpo`"),
    rather than the nearest spelling of an unrelated key of this one."""
    from rlhf.config.stages import STAGE_CONFIGS, stage_of

    mine = stage_of(root)
    if mine is None:
        return None
    owners = [name for name, cls in STAGE_CONFIGS.items() if name != mine and dotted in all_keys(cls)]
    if not owners:
        return None
    commands = " and ".join(f"`rlhf {name}`" for name in owners)
    drop = f"drop --{dotted}" if origin == "command line" else f"remove {dotted} from {origin}"
    return (
        f"{origin}: {dotted} is a key of {commands}, not of `rlhf {mine}`. Fix: {drop}, or run "
        f"`rlhf {owners[0]}` with it (`rlhf config {mine}` lists the keys of `rlhf {mine}`)."
    )


def all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of `cls`, groups and their fields, at every depth."""
    keys = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.append(prefix + f.name)
        if is_group(hints[f.name]):
            keys.extend(all_keys(hints[f.name], f"{prefix}{f.name}."))
    return keys


def to_dict(config) -> dict:
    """A config as plain nested dicts and lists (tuples as lists), as YAML writes it."""

    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(config))


def load_config(
    cls: type,
    *,
    preset: str | None = None,
    file: str | None = None,
    overrides: dict | None = None,
    defaults: dict | None = None,
):
    """Stage defaults < `defaults` < preset < file < overrides, validated into `cls`.

    The layers are plain nested dicts, deep-merged so a later layer replaces only the keys it names;
    `from_dict` then applies the merged keys over `cls()`, whose nested groups come from each field's
    default_factory. A key no layer names keeps that stage default. `defaults` replaces stage
    defaults for one command (e.g. the budgets `rlhf rm-eval` takes from the reward model's run).
    """
    merged: dict = copy.deepcopy(defaults or {})
    file_data: dict = {}
    if preset:
        merged = deep_merge(merged, presets.preset_dict(preset))
        merged["preset"] = preset
    if file:
        file_data = presets.read_yaml(file)
        from_dict(cls, file_data, origin=str(file))  # checked alone first, so errors name the file
        merged = deep_merge(merged, file_data)
    if overrides:
        overrides = copy.deepcopy(overrides)  # the caller's dict shares nothing with the config
        from_dict(cls, overrides, origin="command line")
        merged = deep_merge(merged, overrides)
    config = from_dict(cls, merged, origin=f"preset {preset}" if preset else "config")
    # a key the user set where it cannot apply (a preset's or a default's value stays silent)
    refuse_inapplicable(config, [(str(file), file_data), ("command line", overrides)])
    try:
        config.validate()
        device_names(config)
    except ConfigError as err:  # a rule refused a key: name the file or flags that set it
        origin = _origin_of(err.key, [(str(file), file_data), ("command line", overrides or {})])
        if origin is None:
            raise
        raise ConfigError(f"{origin}: {err}", err.key) from None
    return config


def _origin_of(key: str | None, layers: list[tuple[str, dict]]) -> str | None:
    """The origin of the last layer that names the dotted `key` (None: no layer names it)."""
    found = None
    for origin, data in layers:
        node: Any = data
        for part in (key or "").split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if key and node is not _MISSING:
            found = origin
    return found


_MISSING = object()


def save_config(config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def config_from_yaml(cls: type, path: str | Path):
    """A config written by `save_config` (every key named), e.g. on resume."""
    return from_dict(cls, presets.read_yaml(path), origin=str(path))
