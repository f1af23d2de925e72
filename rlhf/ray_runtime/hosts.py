"""Which actor group serves which role of a run."""

from __future__ import annotations

from rlhf.config import RLConfig

GROUPS = ("policy", "critic", "reference", "reward_model", "rollout")


def role_hosts(config: RLConfig) -> dict[str, list[str]]:
    """{group: the roles its actors serve}. The policy's group also serves a critic on its trunk
    (`model.critic_mode shared`) and a LoRA policy's reference (its adapter switched off: no second
    copy); a separate critic, a copied reference and the reward model have groups of their own."""
    m = config.model
    policy = ["policy"]
    hosts: dict[str, list[str]] = {"policy": policy}
    if config.uses_critic:
        if m.critic_mode == "shared":
            policy.append("critic")
        else:
            hosts["critic"] = ["critic"]
    if m.lora.enabled:
        policy.append("reference")
    else:
        hosts["reference"] = ["reference"]
    if m.reward_model:
        hosts["reward_model"] = ["reward_model"]
    if config.ray.rollout.num_actors > 0:
        hosts["rollout"] = ["policy"]  # a copy of the policy that samples (ROLLOUT)
    return hosts


ROLLOUT = "rollout"  # the group sampling with a copy of the policy (`ray.rollout.num_actors` > 0)


def group_of(hosts: dict[str, list[str]], role: str) -> str:
    """The group serving `role`."""
    for group, roles in hosts.items():  # the policy's own group comes before the rollout's copy
        if role in roles:
            return group
    raise ValueError(
        f"no role {role!r} in this run (its roles: {sorted(r for rs in hosts.values() for r in rs)})"
    )
