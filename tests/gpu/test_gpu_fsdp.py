"""On a CUDA GPU: per-layer fsdp2 (rlhf/parallel/fsdp.py) on one NCCL rank, float32 and bf16.

A process group of one rank runs the sharded code path (every role's layers as FSDP units, the
rollout unsharded once, reduce-scatter and the step on DTensor shards) over NCCL; in float32 its
metrics are the local runtime's. Skipped without CUDA; run with `pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist

from rlhf.runtime import runtime_for
from tests.gpu.test_gpu_rl import records, trainer_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]


@pytest.fixture
def one_nccl_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    try:
        yield
    finally:
        dist.destroy_process_group()


def sharded_trainer(preset, run_dir, dtype, offload=False):
    dist = {"strategy": "fsdp2", "offload": offload}
    return trainer_for(preset, run_dir, dtype=dtype, dist=dist, runtime=runtime_for)


@pytest.mark.parametrize("preset", ["ppo_max", "grpo"])
def test_fsdp2_on_one_nccl_rank_gives_the_local_metrics_in_float32(preset, one_nccl_rank, tmp_path):
    local = trainer_for(preset, tmp_path / "local", dtype="float32")
    local.train()
    sharded = sharded_trainer(preset, tmp_path / "sharded", "float32")
    sharded.train()
    assert sharded.runtime.roles.policy.learner.per_layer
    for got, expected in zip(records(tmp_path / "sharded"), records(tmp_path / "local"), strict=True):
        for key, value in expected.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, abs=1e-3, rel=1e-3), key


def test_fsdp2_on_one_nccl_rank_trains_in_bf16(one_nccl_rank, tmp_path):
    trainer = sharded_trainer("ppo_max", tmp_path / "run", "bfloat16")
    last = trainer.train()
    assert trainer.runtime.roles.policy.learner.per_layer
    assert all(math.isfinite(v) for v in last.values() if isinstance(v, float))
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_fsdp2_with_offload_gives_the_same_metrics_with_its_state_in_cpu_memory(one_nccl_rank, tmp_path):
    """dist.offload: the shards, gradients and AdamW state in CPU memory (CPUOffloadPolicy), each
    layer copied to the GPU for its use; the float32 metrics of the run without offload."""
    plain = sharded_trainer("ppo_max", tmp_path / "plain", "float32")
    plain.train()
    offloaded = sharded_trainer("ppo_max", tmp_path / "offload", "float32", offload=True)
    offloaded.train()
    assert all(
        p.to_local().device.type == "cpu" for p in offloaded.runtime.roles.policy.learner.module.parameters()
    )
    for got, expected in zip(records(tmp_path / "offload"), records(tmp_path / "plain"), strict=True):
        for key, value in expected.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, abs=1e-3, rel=1e-3), key
    assert (tmp_path / "offload" / "model.safetensors").exists()


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_supervised_fsdp2_with_offload_keeps_its_shards_in_cpu_memory_with_the_same_metrics(
    stage, one_nccl_rank, tmp_path
):
    """`rlhf sft|dpo --dist.offload`: every unit (DPO's reference copy too) under CPUOffloadPolicy,
    the shards in CPU memory between uses, the batches on the GPU; the float32 metrics and the
    exported model of the run without offload. (On the CPU the policy moves nothing: the CPU tests,
    tests/runtime/test_distributed.py, check it is in effect and the numbers.)"""
    from tests.support.dist_cases import supervised_run, write_supervised_data

    data = write_supervised_data(tmp_path)[stage]
    plain = supervised_run(stage, str(tmp_path / "plain"), data, "fsdp2")
    offloaded = supervised_run(f"{stage}-offload", str(tmp_path / "offload"), data, "fsdp2")
    assert offloaded["offload_policies"] and set(offloaded["offload_policies"]) == {"CPUOffloadPolicy"}
    assert set(plain["offload_policies"]) == {"OffloadPolicy"}
    for key, value in plain["last"].items():
        if isinstance(value, float):
            assert offloaded["last"][key] == pytest.approx(value, abs=1e-4, rel=1e-4), key
    for name, tensor in plain["exported"].items():
        torch.testing.assert_close(offloaded["exported"][name], tensor, atol=1e-4, rtol=1e-4)
