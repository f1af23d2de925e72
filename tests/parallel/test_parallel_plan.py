"""A learner gets its data-parallel strategy when it is built (rlhf/parallel/parallel_plan.py): the
roles assembled inside a process group (one gloo rank here) come out replicated (ddp) or with their
sharding planned (fsdp2), only those the process hosts; the torchrun runtime sets nothing on them
and refuses roles built outside the group."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from rlhf.models.tiny import word_tokenizer
from rlhf.parallel.parallel_plan import parallel_plan
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.runtime import DistributedRuntime, LocalRuntime
from tests.support.dist_cases import tiny_models
from tests.support.train_testing import WORDS, rl_config


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def roles_of(config, hosted=None):
    tok = word_tokenizer([" ".join(WORDS)])
    policy, reward_model = tiny_models(tok)
    return assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model, hosted=hosted)


def test_outside_a_process_group_there_is_no_plan_and_the_runtime_refuses_such_roles(tmp_path):
    config = rl_config("ppo_max")
    assert parallel_plan(config.dist) is None
    roles = roles_of(config)
    assert roles.policy.learner.peers is None and roles.critic.learner.peers is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="built outside the process group"):
            DistributedRuntime(roles, config.runtime)
    finally:
        dist.destroy_process_group()


def test_ddp_learners_are_replicated_when_built_and_the_runtime_leaves_them_as_they_are(
    one_rank, monkeypatch
):
    monkeypatch.setattr("rlhf.runtime.local.side_by_side_threads", lambda: 1)  # as on 2 or more cores
    config = rl_config("ppo_max", {"dist": {"strategy": "ddp"}})
    roles = roles_of(config)
    policy, critic = roles.policy.learner, roles.critic.learner
    built = (policy.replicated, critic.replicated)
    assert all(r is not None for r in built) and policy.peers.world_size == 1
    assert policy.replicated.find_unused_parameters is False  # no value head on the policy: no unused walk
    DistributedRuntime(roles, config.runtime, strategy="ddp")
    assert (policy.replicated, critic.replicated) == built  # nothing set after construction
    # never side by side on two threads: both all-reduce on the one process group
    assert LocalRuntime(roles, config.runtime).overlap_threads(roles.learners()) is None


def test_learners_built_outside_a_group_may_step_side_by_side(monkeypatch):
    monkeypatch.setattr("rlhf.runtime.local.side_by_side_threads", lambda: 1)  # as on 2 or more cores
    roles = roles_of(rl_config("ppo_max"))
    assert LocalRuntime(roles, rl_config("ppo_max").runtime).overlap_threads(roles.learners()) == 1


def test_fsdp2_learners_are_sharded_as_planned_at_the_first_use_and_once(one_rank):
    config = rl_config("ppo_max", {"dist": {"strategy": "fsdp2", "grad_sync": "step"}})
    roles = roles_of(config)
    policy = roles.policy.learner
    assert policy.shard_pending and policy.sharded is None and policy.replicated is None
    assert policy.plan is not None and (
        policy.plan.bf16_compute,
        policy.plan.offload,
        policy.plan.sync_once,
    ) == (
        False,
        False,
        True,
    )
    runtime = DistributedRuntime(roles, config.runtime, strategy="fsdp2")
    assert policy.sharded is None  # not before the first use (a resume loads the whole state first)
    runtime.shard_roles()
    assert policy.sharded is not None and policy.per_layer and policy.data_parallel.sync_once
    assert not policy.shard_pending and roles.critic.learner.sharded is not None
    sharded = policy.sharded
    policy.shard()
    assert policy.sharded is sharded


def test_only_the_hosted_learners_get_the_plan(one_rank):
    config = rl_config("ppo_max", {"dist": {"strategy": "ddp"}})
    roles = roles_of(config, hosted=frozenset({"policy"}))
    assert roles.policy.learner.replicated is not None
    assert (
        roles.critic.learner.peers is None and roles.critic.learner.replicated is None
    )  # served by another group
