"""`rlhf train --dist.runtime ray`: the RL loop on the driver, each role a group of Ray actors
(docs/distributed.md "Ray").

    hosts.py      which actor group serves which role (policy, critic, reference, reward_model)
    placement.py  the placement groups: colocated (roles share bundles) or separate
    worker.py     the actor: builds its roles, runs the local/data-parallel runtime over them
    runtime.py    the driver's runtime: the loop's calls by name, sent to the groups

The loop (rlhf/rl/trainer.py) is the one every runtime runs."""

from rlhf.ray_runtime.runtime import RayRuntime

__all__ = ["RayRuntime"]
