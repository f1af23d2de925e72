"""The shipped presets (rlhf/presets/*.yaml, package data) and the YAML reader that names the file
on every error."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlhf.config.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
PRESETS = ("vanilla_ppo", "ppo_max", "apa", "awr", "grpo", "rloo", "reinforce_pp")


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping; errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
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
