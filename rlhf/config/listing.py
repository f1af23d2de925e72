"""`rlhf config STAGE [--preset NAME]`: every key of a stage with its type, default (or the preset's
value), range and unit, the condition under which it applies, and its one-line doc, all read from
the declarations beside the fields (rlhf/config/keys.py)."""

from __future__ import annotations

import dataclasses

from rlhf.config.errors import ConfigError
from rlhf.config.fields import flag_value, is_group, type_hints
from rlhf.config.keys import describe
from rlhf.config.loader import leaf_keys, load_config
from rlhf.config.presets import PRESETS, preset_dict
from rlhf.config.stages import STAGE_CONFIGS

DOC_WIDTH = 110  # characters of a key's doc shown on its line


def groups(cls: type) -> list[str]:
    """The groups of a stage config (its fields that are config dataclasses)."""
    hints = type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if is_group(hints[f.name])]


def help_epilog(stage: str) -> str:
    """The end of `rlhf STAGE --help`: the config groups and where every key is listed."""
    cls = STAGE_CONFIGS[stage]
    return (
        f"config groups: {', '.join(groups(cls))} (--GROUP.KEY VALUE, or GROUP: {{KEY: VALUE}} in --config). "
        f"Every key with its type, default, range and when it applies: rlhf config {stage}"
    )


def render(stage: str, preset: str | None = None) -> str:
    if stage not in STAGE_CONFIGS:
        raise ConfigError(f"unknown stage {stage!r}. Fix: rlhf config one of {', '.join(STAGE_CONFIGS)}.")
    cls = STAGE_CONFIGS[stage]
    stated: set[str] = set()
    if preset is not None:
        if stage != "train":
            raise ConfigError(
                f"--preset {preset}: presets are `rlhf train`'s ({', '.join(PRESETS)}). "
                f"Fix: rlhf config train --preset {preset}, or drop --preset."
            )
        config = load_config(cls, preset=preset)
        stated = set(leaf_keys(preset_dict(preset)))
    else:
        config = cls()
    rows = describe(config)
    width = max(len(r.key) for r in rows)
    title = f"rlhf {stage}" + (f" --preset {preset} (* the preset's values)" if preset else "")
    lines = [f"{title}: KEY  TYPE = DEFAULT  RANGE  (applies when ...)  -- doc"]
    for r in rows:
        mark = "*" if r.key in stated else " "
        parts = [f"{r.key.ljust(width)} {mark}{r.type} = {flag_value(r.default)}"]
        if r.range:
            parts.append(r.range)
        if r.when:
            parts.append(f"(applies when {r.when})")
        doc = r.doc if len(r.doc) <= DOC_WIDTH else r.doc[: DOC_WIDTH - 3].rstrip() + "..."
        if doc:
            parts.append(f"-- {doc}")
        lines.append("  ".join(parts))
    lines.append(
        f"{len(rows)} keys. A value outside its range stops with exit 2; so does a key set (--config file or "
        "flag) where it does not apply. docs/usage.md: rlhf config"
    )
    return "\n".join(lines)
