"""The one exception of the config package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration mistake (bad key, bad value, bad file): the message names the key,
    the value given and the fix."""
