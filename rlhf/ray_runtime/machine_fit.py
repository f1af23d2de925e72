"""`rlhf train --dist.runtime ray` with Ray started here (no `ray.address`): the roles' CPU
reservations scaled to this machine, so that every actor starts (`open_run` calls it after the
preflight checks; docs/distributed.md "Ray")."""

from __future__ import annotations

import os
import sys

from rlhf.config import ConfigError, RLConfig


def machine_cpus() -> int:
    """The CPUs this process may use (affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fit_ray_to_machine(config: RLConfig, explicit: set[str], cpus: int | None = None) -> str | None:
    """When rlhf starts Ray itself (`dist.runtime ray`, no `ray.address`), the roles' CPU reservations
    fit this machine: each group's `num_cpus` left at its default is scaled down so that every actor
    starts (by default each asks 1 CPU, and a run has 3 to 5 groups). Values the user set
    (`explicit`: dotted keys) are kept, and refused here when they cannot fit. Returns the line that
    says what was chosen (None: nothing changed)."""
    if getattr(config.dist, "runtime", "local") != "ray" or config.ray.address is not None:
        return None
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # a Ray this process started: its own CPU count holds
        return None
    from rlhf.ray_runtime.hosts import role_hosts
    from rlhf.ray_runtime.placement import planned_bundles

    cpus = machine_cpus() if cpus is None else cpus
    groups = list(role_hosts(config))
    asked = sum(b.get("CPU", 0.0) for bundles in planned_bundles(config.ray, groups) for b in bundles)
    if asked <= cpus + 1e-9:
        return None
    chosen = [g for g in groups if f"ray.{g}.num_cpus" in explicit]
    if chosen:
        parts = ", ".join(f"ray.{g}.num_cpus {getattr(config.ray, g).num_cpus:g}" for g in groups)
        raise ConfigError(
            f"the Ray roles ask for {asked:g} CPUs in all ({parts}; {len(groups)} groups), and this machine has "
            f"{cpus}. Fix: lower the values you set (e.g. --ray.{chosen[0]}.num_cpus "
            f"{max(0.1, round(cpus / len(groups), 2)):g}), or join a larger cluster with --ray.address.",
            f"ray.{chosen[0]}.num_cpus",
        )
    scale = cpus / asked
    for group in groups:
        spec = getattr(config.ray, group)
        spec.num_cpus = max(0.01, int(spec.num_cpus * scale * 100) / 100)  # rounded down: it fits
    shares = ", ".join(f"{g} {getattr(config.ray, g).num_cpus:g}" for g in groups)
    return (
        f"ray: this machine has {cpus} CPUs for {len(groups)} role groups; each actor reserves ({shares}) "
        "CPUs (ray.GROUP.num_cpus sets them)"
    )
