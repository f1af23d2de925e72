"""`rlhf train --dist.runtime ray`: each role a group of Ray actors on resources of its own or
shared (docs/distributed.md "Ray"; rlhf/ray_runtime/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import at_least
from rlhf.config.common import DistConfig
from rlhf.config.keys import setting


@dataclass
class RoleGroupConfig:
    """One role's group of Ray actors: each holds the role's whole model (several actors: data
    parallel over a torch.distributed group of their own, each with a share of the rows)."""

    num_actors: int = setting(1, ">= 0", unit="actors")  # the role's actors (0: only the rollout group)
    # CPUs each actor reserves (and its intra-op threads, at least 1)
    num_cpus: float = setting(1.0, ">= 0", unit="CPUs")
    # GPUs each actor reserves; a fraction shares one GPU among colocated roles
    num_gpus: float = setting(0.0, ">= 0", unit="GPUs")

    def validate(self, prefix: str, fewest: int = 1) -> None:
        at_least(self.num_actors, fewest, f"{prefix}num_actors")


@dataclass
class RayConfig:
    # None: start a Ray instance on this machine; "auto" or HOST:PORT: join a running cluster
    address: str | None = None
    # colocate: one placement group, actor i of every role in its bundle i (roles share the bundle's
    # CPUs/GPUs, as OpenRLHF's colocated roles); separate: a placement group per role
    placement: Literal["colocate", "separate"] = "colocate"
    # seconds to wait for the placement groups' resources before the run stops with what is missing
    placement_timeout: float = setting(120.0, "> 0", unit="seconds")
    show_logs: bool = False  # Ray's own log lines (and the actors' output) in the console
    policy: RoleGroupConfig = field(default_factory=RoleGroupConfig)  # + a shared critic, a LoRA reference
    critic: RoleGroupConfig = field(default_factory=RoleGroupConfig)  # a separate critic
    reference: RoleGroupConfig = field(default_factory=RoleGroupConfig)  # a copy of the SFT policy
    reward_model: RoleGroupConfig = field(default_factory=RoleGroupConfig)
    # actors sampling the rollouts with a copy of the policy, its weights sent from the policy's
    # group after each update (0: the policy's own actors sample)
    rollout: RoleGroupConfig = field(default_factory=lambda: RoleGroupConfig(num_actors=0))

    def validate(self, prefix: str) -> None:
        for name in ("policy", "critic", "reference", "reward_model"):
            getattr(self, name).validate(f"{prefix}{name}.")
        self.rollout.validate(f"{prefix}rollout.", fewest=0)


@dataclass
class RLDistConfig(DistConfig):
    # local: this process, or every rank of a torchrun launch holding every role | ray: each role a
    # group of Ray actors placed by the `ray` settings (rlhf/ray_runtime/; `rlhf train` only)
    runtime: Literal["local", "ray"] = "local"
