"""RL on a device and in a precision (issue: train.device, dtype, model.gradient_checkpointing),
checked on the CPU: bf16 runs on a CPU too, slowly. The CUDA runs are in tests/gpu/test_gpu_rl.py."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from rlhf.config import ConfigError
from rlhf.models.grad_checkpointing import is_gradient_checkpointing
from rlhf.models.logprobs import response_logprobs
from tests.support.train_testing import metric_rows, rl_config


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat16-pure"])
def test_bf16_runs_train_and_export_float32(make_trainer, tmp_path, dtype):
    run = tmp_path / dtype
    trainer = make_trainer(rl_config("ppo_max", dtype=dtype), run_dir=run)
    policy = trainer.runtime.roles.policy.model
    stored = torch.bfloat16 if dtype == "bfloat16-pure" else torch.float32
    assert {p.dtype for p in policy.parameters()} == {stored}
    assert (
        trainer.runtime.roles.critic.model.head.weight.dtype == torch.float32
    )  # the scalar head stays float32
    before = {n: p.detach().float().clone() for n, p in policy.named_parameters()}
    trainer.train()
    rows = metric_rows(run, kinds=("iteration",))
    assert len(rows) == 2
    for row in rows:
        for key in ("policy/loss", "value/loss", "kl/ref", "reward/raw_mean", "policy/grad_norm"):
            assert math.isfinite(row[key]), key
    assert any(not p.detach().float().equal(before[n]) for n, p in policy.named_parameters())
    exported = load_file(str(run / "model.safetensors"))
    assert {t.dtype for t in exported.values()} == {torch.float32}
    assert {p.dtype for p in policy.parameters()} == {stored}  # the export did not change the run's model


def test_bf16_autocast_experience_is_float32(make_trainer):
    trainer = make_trainer(rl_config("ppo_max", dtype="bfloat16"))
    experience, _ = trainer.make_experience()
    for name in ("old_logp", "ref_logp", "old_values", "advantages", "returns"):
        assert getattr(experience, name).dtype == torch.float32, name
    # bf16 forwards drift from float32 ones, but stay close on a tiny model
    policy = (
        trainer.runtime.roles.policy.model
    )  # float32 weights: a forward without autocast is a float32 one
    with torch.no_grad():
        exact = response_logprobs(
            policy, experience.input_ids, experience.attention_mask, experience.prompt_length
        )[0]
    mask = experience.response_mask.bool()
    drift = (experience.old_logp - exact)[mask].abs().max()
    assert 0 < drift < 0.1  # the rollout's forwards did run in bf16, and stayed close


def test_gradient_checkpointing_gives_the_same_update(make_trainer, tmp_path):
    """Activation checkpointing of the policy's and critic's decoder layers, with the roles in eval
    mode (no dropout), recomputes the layers in the backward and changes no number."""
    config = rl_config("ppo_max", train={"iterations": 2})
    plain = make_trainer(config, run_dir=tmp_path / "plain")
    checkpointed = make_trainer(
        rl_config("ppo_max", model={"gradient_checkpointing": True}), run_dir=tmp_path / "ckpt"
    )
    assert is_gradient_checkpointing(checkpointed.runtime.roles.policy.model)
    assert is_gradient_checkpointing(checkpointed.runtime.roles.critic.model)
    assert not checkpointed.runtime.roles.policy.model.training  # dropout stays off

    def mlp_calls_in_a_step(trainer) -> int:
        """Calls of the first layer's MLP in one policy step: the recompute in the backward calls it again."""
        calls = []
        mlp = trainer.runtime.roles.policy.model.model.layers[0].mlp
        forward = mlp.forward  # an instance wrapper: module hooks do not fire in the recompute
        mlp.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        experience, _ = trainer.make_experience()
        calls.clear()
        experience.advantages = experience.response_mask.clone()
        trainer.runtime.roles.policy.train_step(experience, experience.num_tokens)
        del mlp.forward
        return len(calls)

    micro_batches = -(-config.rollout.batch_size // config.train.micro_batch_size)
    assert mlp_calls_in_a_step(plain) == micro_batches
    assert mlp_calls_in_a_step(checkpointed) == 2 * micro_batches
    plain = make_trainer(config, run_dir=tmp_path / "plain2")
    plain.train()
    checkpointed_run = make_trainer(
        rl_config("ppo_max", model={"gradient_checkpointing": True}), run_dir=tmp_path / "ckpt2"
    )
    checkpointed_run.train()
    want, got = metric_rows(tmp_path / "plain2"), metric_rows(tmp_path / "ckpt2")
    for a, b in zip(want, got):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_cuda_device_without_cuda_names_the_key_and_the_fix(make_trainer):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"train\.device.*Fix: set train\.device to cpu"):
        make_trainer(rl_config("ppo_max", train={"device": "cuda"}))
