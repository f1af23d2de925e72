"""`dist.runtime ray` without Ray: which group serves which role, the placement's bundles, what
is refused before any actor starts."""

from __future__ import annotations

import pytest

from rlhf.config import ConfigError, RLConfig
from rlhf.ray_runtime.hosts import group_of, role_hosts
from rlhf.ray_runtime.placement import check_fits, planned_bundles


def config(**changes) -> RLConfig:
    c = RLConfig()
    c.model.policy, c.model.reward_model = "sft", "rm"
    for key, value in changes.items():
        group, name = key.split("__")
        setattr(getattr(c, group), name, value)
    return c


def test_each_role_has_one_group_and_the_policys_group_serves_its_shared_trunk_and_lora_reference():
    assert role_hosts(config()) == {
        "policy": ["policy"], "critic": ["critic"], "reference": ["reference"], "reward_model": ["reward_model"]
    }  # fmt: skip
    shared = config(model__critic_mode="shared")
    shared.model.lora.enabled = True
    assert role_hosts(shared) == {
        "policy": ["policy", "critic", "reference"],
        "reward_model": ["reward_model"],
    }
    free = config(advantage__estimator="grpo", model__reward_model="")
    free.ray.rollout.num_actors = 2
    hosts = role_hosts(free)
    assert hosts == {"policy": ["policy"], "reference": ["reference"], "rollout": ["policy"]}
    assert group_of(hosts, "policy") == "policy"  # the trainer's copy, not the rollout's
    with pytest.raises(ValueError, match="no role 'critic'"):
        group_of(hosts, "critic")


def test_colocated_bundles_add_up_each_actors_resources_and_separate_ones_do_not():
    c = config()
    c.ray.policy.num_actors, c.ray.policy.num_gpus, c.ray.critic.num_gpus = 2, 0.5, 0.25
    groups = ["policy", "critic", "reference", "reward_model"]
    # bundle 0: actor 0 of every group (4 x 1 CPU, 0.5 + 0.25 GPU); bundle 1: the policy's second actor
    assert planned_bundles(c.ray, groups) == [[{"CPU": 4.0, "GPU": 0.75}, {"CPU": 1.0, "GPU": 0.5}]]
    c.ray.placement = "separate"
    assert planned_bundles(c.ray, groups) == [
        [{"CPU": 1.0, "GPU": 0.5}] * 2, [{"CPU": 1.0, "GPU": 0.25}], [{"CPU": 1.0}], [{"CPU": 1.0}]
    ]  # fmt: skip


def test_a_placement_larger_than_the_cluster_is_refused_naming_the_roles_and_a_fix():
    c = config()
    groups = ["policy", "critic", "reference", "reward_model"]
    check_fits(c.ray, groups, {"CPU": 4.0})
    with pytest.raises(ConfigError) as refused:
        check_fits(c.ray, groups, {"CPU": 2.0})
    message = str(refused.value)
    assert "ask for 4 CPUs" in message and "the cluster has 2" in message and "Fix:" in message
    c.ray.reference.num_gpus = 1
    with pytest.raises(ConfigError, match="ask for 1 GPUs"):
        check_fits(c.ray, groups, {"CPU": 8.0})


@pytest.mark.parametrize(
    "changes, words",
    [
        ({}, "needs dist.runtime ray and ray.rollout.num_actors >= 1"),
        ({"dist__runtime": "ray"}, "ray.rollout.num_actors >= 1 (got 'ray' and 0)"),
        ({"dist__runtime": "ray", "policy__loss": "apa", "rollout_actors": 1}, "needs policy.loss ppo"),
    ],
)
def test_asynchronous_rollouts_are_refused_without_a_rollout_group_or_with_another_loss(changes, words):
    actors = changes.pop("rollout_actors", 0)
    c = config(rollout__max_staleness=1, **changes)
    c.ray.rollout.num_actors = actors
    with pytest.raises(ConfigError, match="rollout.max_staleness") as refused:
        c.validate()
    assert words in str(refused.value) and "Fix:" in str(refused.value)


def test_asynchronous_rollouts_with_a_rollout_group_and_ppo_validate():
    c = config(rollout__max_staleness=1, dist__runtime="ray")
    c.ray.rollout.num_actors = 1
    c.validate()
    c.ray.rollout.num_actors = -1
    with pytest.raises(ConfigError, match="ray.rollout.num_actors"):
        c.validate()
