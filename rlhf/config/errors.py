"""The one exception of the config package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration mistake (bad key, bad value, bad file): the message names the key,
    the value given and the fix. `key`: the dotted key a rule refused, so that the loader can name
    the file or flags that set it."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key
