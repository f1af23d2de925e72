"""The shipped presets (rlhf/presets/*.yaml, package data) and the YAML reader that names the file
on every error."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlhf.config.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
PRESETS = (
    "vanilla_ppo",
    "ppo_max",
    "apa",
    "awr",
    "grpo",
    "rloo",
    "reinforce_pp",
    "dapo",
    "gspo",
    "cispo",
    "online_dpo",
)


MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, but a key given twice in one mapping is an error: YAML keeps the last silently, so
    a second `optim:` block would drop every key of the first. Merge keys (`<<: *anchor`) read as
    safe_load reads them: the mapping's own keys override the merged ones, which is no duplicate."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], key_node.start_mark.line + 1)
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: safe_load's own error follows
                    pass
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping; errors name the file."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}  # noqa: S506 (safe)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found. Fix: check the path.") from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory, not a config file. Fix: give the YAML file inside it (--config DIR/FILE.yaml)."
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{path}: the config file cannot be read (permission denied). Fix: make it readable "
            f"(chmod u+r {path}) or give another file."
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not a text file (byte {err.start} is not UTF-8). Fix: give a YAML file "
            "(key: value lines), e.g. a run's config.yaml."
        ) from None
    except OSError as err:
        raise ConfigError(
            f"{path}: the config file cannot be read ({err.strerror or err}). Fix: check the path."
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}. Fix: correct the YAML where it says.") from None
    except _DuplicateKey as err:
        raise ConfigError(
            f"{path}:{err.again}: key {err.key!r} is given twice in one mapping (first on line {err.first}); "
            "YAML would keep only the last, silently. Fix: merge the two into one (one `group:` block per group)."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of keys, got {type(data).__name__}. "
            "Fix: write `group: {key: value}` lines."
        )
    return data


def preset_dict(name: str) -> dict:
    """The YAML mapping of a shipped preset."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown preset {name!r}. Fix: use one of {', '.join(PRESETS)}.")
    return read_yaml(path)
