"""Where each role's actors run: Ray placement groups (docs/distributed.md "Ray").

colocate: one placement group whose bundle i holds actor i of every role (the roles share its CPUs
and GPUs, fractions of a GPU each, as OpenRLHF's colocated roles do); separate: a placement group
per role, each actor a bundle of its own. Asking for more than the cluster has stops the run before
any model loads, naming what was asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlhf.config import ConfigError
from rlhf.config.ray import RayConfig, RoleGroupConfig

if TYPE_CHECKING:  # Ray is imported when a run asks for it
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def bundle(cpus: float, gpus: float) -> dict[str, float]:
    """A Ray bundle (never empty: a role asking for nothing still takes a sliver of a CPU)."""
    resources = {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}
    return resources or {"CPU": 0.01}


def planned_bundles(ray_config: RayConfig, groups: list[str]) -> list[list[dict[str, float]]]:
    """The bundles of each placement group: one group when colocated, else one per role."""
    specs: list[RoleGroupConfig] = [getattr(ray_config, g) for g in groups]
    if ray_config.placement == "separate":
        return [[bundle(s.num_cpus, s.num_gpus)] * s.num_actors for s in specs]
    width = max(s.num_actors for s in specs)
    return [
        [
            bundle(
                sum(s.num_cpus for s in specs if s.num_actors > i),
                sum(s.num_gpus for s in specs if s.num_actors > i),
            )
            for i in range(width)
        ]
    ]


def check_fits(ray_config: RayConfig, groups: list[str], available: dict[str, float]) -> None:
    """Refuse (exit 2) a placement asking for more CPUs or GPUs than the cluster has in all."""
    asked: dict[str, float] = {}
    for bundles in planned_bundles(ray_config, groups):
        for b in bundles:
            for key, value in b.items():
                asked[key] = asked.get(key, 0.0) + value
    for key, value in asked.items():
        have = available.get(key, 0.0)
        if value > have + 1e-9:
            parts = " + ".join(
                f"{g} {getattr(ray_config, g).num_actors} x {getattr(ray_config, g).num_cpus if key == 'CPU' else getattr(ray_config, g).num_gpus:g}"
                for g in groups
            )
            option = "num_cpus" if key == "CPU" else "num_gpus"
            raise ConfigError(
                f"the Ray roles ask for {value:g} {key}s ({parts}), the cluster has {have:g}. "
                f"Fix: fewer per role (e.g. --ray.reference.{option} 0.5), fewer actors, or a larger cluster "
                f"(--ray.address).",
                f"ray.policy.{option}",
            )


def place(
    ray_config: RayConfig, groups: list[str]
) -> tuple[list[PlacementGroup], dict[str, list[PlacementGroupSchedulingStrategy]]]:
    """(the placement groups, {group: each actor's scheduling strategy}), once their resources are
    reserved; a placement not ready within `ray.placement_timeout` stops the run."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    check_fits(ray_config, groups, ray.cluster_resources())
    placements = [placement_group(b, strategy="PACK") for b in planned_bundles(ray_config, groups)]
    ready, _ = ray.wait([p.ready() for p in placements], num_returns=len(placements),
                        timeout=ray_config.placement_timeout)  # fmt: skip
    if len(ready) < len(placements):
        for p in placements:
            ray.util.remove_placement_group(p)
        raise ConfigError(
            f"the Ray placement groups were not ready within ray.placement_timeout "
            f"{ray_config.placement_timeout:g} s (the cluster's free resources: {ray.available_resources()}). "
            "Fix: free the resources, ask for fewer per role, or --ray.placement_timeout 600.",
            "ray.placement_timeout",
        )
    strategies: dict[str, list[PlacementGroupSchedulingStrategy]] = {}
    for index, group in enumerate(groups):
        spec: RoleGroupConfig = getattr(ray_config, group)
        pg = placements[0] if ray_config.placement == "colocate" else placements[index]
        strategies[group] = [
            PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
            for i in range(spec.num_actors)
        ]
    return placements, strategies
