"""Which settings of its config group a registered policy loss or advantage estimator reads: the
attributes its `settings` function reads (rlhf/core/losses.py `register_policy_loss`,
rlhf/core/advantages.py `register_estimator`). That function is the one declaration: it feeds the
loss and it tells the checks which keys the chosen loss or estimator ignores (refused, rl_algorithm.py
`read_by`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _Reading:
    """Stands for a config group: answers each attribute from `group` and notes its name."""

    def __init__(self, group: object) -> None:
        self._group = group
        self.names: set[str] = set()

    def __getattr__(self, name: str) -> Any:  # only for names this object lacks: the group's
        self.names.add(name)
        return getattr(self._group, name)


def attributes_read(settings: Callable[[Any], object], group: object) -> frozenset[str]:
    """The attributes of `group` that `settings(group)` reads."""
    reading = _Reading(group)
    settings(reading)
    return frozenset(reading.names)
