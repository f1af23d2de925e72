"""Where a sharded run's roles are built: on the CPU until fully_shard moves each rank's shards to
its device, under torchrun and in a Ray role group alike (rlhf/parallel/process_group.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlhf.config import RLConfig, load_config
from rlhf.models.tiny import tiny_causal_lm
from rlhf.parallel.process_group import in_sharded_group
from rlhf.rl.roles import assemble


def test_one_process_is_no_sharded_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not in_sharded_group("fsdp2") and not in_sharded_group("ddp")


def test_a_torchrun_launch_of_two_is_a_sharded_group_under_fsdp2_only(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert in_sharded_group("fsdp2") and not in_sharded_group("ddp")


def two_rank_group(monkeypatch) -> None:
    """A Ray role group's actor: a process group of 2 started by the actor, no torchrun env."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)


def test_a_ray_groups_actor_is_a_sharded_group_without_torchruns_env(monkeypatch):
    two_rank_group(monkeypatch)
    assert in_sharded_group("fsdp2") and not in_sharded_group("ddp")


@pytest.mark.parametrize("grouped", [False, True])
def test_a_sharded_groups_policy_is_built_on_the_cpu_not_on_its_gpu(monkeypatch, tok, grouped):
    if grouped:
        two_rank_group(monkeypatch)
    cuda = torch.device("cuda", 0)  # what train.device resolves to on a GPU machine
    monkeypatch.setattr(assemble, "resolve_device", lambda name, key: cuda)
    moved = []
    monkeypatch.setattr(assemble.Precision, "prepare", lambda self, model, device: moved.append(device))
    config = load_config(
        RLConfig, preset="ppo_max", overrides={"dtype": "float32", "dist": {"strategy": "fsdp2"}}
    )
    policy = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    device, _, place = assemble._place_models(config, policy, None)
    assert device == cuda
    assert place == moved[0] == (torch.device("cpu") if grouped else cuda)
