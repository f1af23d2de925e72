"""bench/memory/memory_phases.py wraps functions of the package by name: every name it wraps still exists
(a renamed one would stop the bench before its run)."""

from __future__ import annotations

import pytest

from bench.memory.memory_phases import PHASES, phase_target


@pytest.mark.parametrize("path,attr", [(path, attr) for path, attr, _ in PHASES])
def test_every_phase_names_a_function_of_the_package(path: str, attr: str) -> None:
    assert callable(getattr(phase_target(path), attr))


def test_the_saved_tensor_hooks_name_functions_of_the_package() -> None:
    from rlhf.rl.roles import critic, policy

    assert callable(policy.Policy.policy_terms) and callable(critic.value_micro_loss)
