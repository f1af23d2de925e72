"""On a CUDA GPU: 3 RL iterations of every preset in float32 and bf16, and exact resume.

Skipped (with the reason shown by `pytest -ra`) without CUDA; run with `pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.config import PRESETS, RLConfig, deep_merge, load_config
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
TINY = {
    "seed": 0,
    "train": {"iterations": 3, "micro_batch_size": 4, "minibatches": 2, "device": "cuda"},
    "rollout": {"batch_size": 8, "max_new_tokens": 5},
    "critic": {"pretrain_iterations": 1},
    "policy_optim": {"lr": 1e-3},
    "critic_optim": {"lr": 1e-3},
    "log": {"sinks": ["jsonl"]},
}


def trainer_for(preset: str, run_dir, *, resume=False, runtime=None, **layers) -> RLTrainer:
    """`runtime(roles, config)`: the runtime that serves the roles (LocalRuntime when None)."""
    tok = word_tokenizer([" ".join(WORDS)])
    tiny = TINY
    if not load_config(RLConfig, preset=preset).uses_critic:  # critic settings are errors there
        tiny = {k: v for k, v in TINY.items() if k not in ("critic", "critic_optim")}
    config = load_config(RLConfig, preset=preset, overrides=deep_merge(tiny, {"out": str(run_dir), **layers}))
    policy = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2)
    reward = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=2, num_heads=2)
    )
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward)
    prompts = [tok(" ".join(WORDS[i : i + 2 + i % 3]))["input_ids"] for i in range(12)]
    served = runtime(roles, config) if runtime is not None else LocalRuntime(roles, config.runtime)
    return RLTrainer(config, served, prompts, run_dir=run_dir, resume=resume, quiet=True)


def records(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
        for r in rows
        if "event" not in r
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_three_iterations_of_each_preset_on_cuda(preset, dtype, tmp_path):
    trainer = trainer_for(preset, tmp_path / "run", dtype=dtype)
    assert next(trainer.runtime.roles.policy.model.parameters()).device.type == "cuda"
    assert trainer.runtime.roles.policy.generator.device.type == "cuda"
    trainer.train()
    rows = [r for r in records(tmp_path / "run") if "iteration" in r]
    assert len(rows) == 3
    for row in rows:
        assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float)), row
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_resume_on_cuda_gives_the_uninterrupted_metrics(tmp_path):
    layers = {"checkpoint": {"every": 1}, "train": {**TINY["train"], "iterations": 3}}
    trainer_for("ppo_max", tmp_path / "whole", **layers).train()
    first = trainer_for(
        "ppo_max", tmp_path / "split", **{**layers, "train": {**layers["train"], "iterations": 2}}
    )
    first.train()
    trainer_for("ppo_max", tmp_path / "split", resume=True, **layers).train()
    assert records(tmp_path / "split") == records(tmp_path / "whole")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_compile_on_cuda_logs_the_eager_metrics(dtype, tmp_path):
    """`train.compile` with inductor's GPU backend (triton), ppo_max: the critic's pre-training and the
    first iteration (drawn by the same policy weights) log the eager run's figures (float32: to float
    rounding; bf16: fused kernels round bf16 intermediates elsewhere, so to bf16's resolution); later
    iterations sample from weights a rounding apart, so they are only finite; the update compiled."""
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    runs = []
    for name, compile in (("eager", False), ("compiled", True)):
        trainer_for(
            "ppo_max", tmp_path / name, dtype=dtype, train={**TINY["train"], "compile": compile}
        ).train()
        runs.append(records(tmp_path / name))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    tolerance = {"rel": 1e-3, "abs": 1e-4} if dtype == "float32" else {"rel": 5e-2, "abs": 2e-2}
    assert len(runs[0]) == len(runs[1]) >= 3
    for eager, compiled in zip(runs[0][:2], runs[1][:2]):
        assert eager.keys() == compiled.keys()
        for key, value in eager.items():
            if isinstance(value, float) and not key.startswith("perf/"):
                assert compiled[key] == pytest.approx(value, **tolerance), key
    for row in runs[1]:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
