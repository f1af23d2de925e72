"""LoRA checkpoints hold the trained parameters only (the adapters, the value head), resume exactly,
and refuse a checkpoint without them or on other base weights."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors import safe_open

from rlhf.config import ConfigError
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rundir import checkpoint as ckpt
from tests.rl.test_resume import Interrupted, interrupt_at
from tests.support.train_testing import metric_rows, rl_config

ITERATIONS = 4


def lora_config(out):
    return rl_config(
        "ppo_max",
        out=out,
        train={"iterations": ITERATIONS},
        checkpoint={"every": 2, "keep": 1},
        model={"lora": {"enabled": True, "r": 4}, "critic_lora": {"enabled": True, "r": 2}},
        policy_optim={"schedule": "cosine", "warmup_steps": 2},
    )


def run_until(trainer, iteration: int) -> None:
    """Run `trainer` until it starts iteration `iteration`, then die (like a killed process)."""
    interrupt_at(trainer, iteration)
    with pytest.raises(Interrupted):
        trainer.train()


def stored(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


def test_a_lora_checkpoint_holds_the_trained_parameters_only_and_resumes_exactly(make_trainer, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    uninterrupted = make_trainer(lora_config(whole), run_dir=whole)
    uninterrupted.train()

    first = make_trainer(lora_config(split), run_dir=split)
    run_until(first, 3)
    checkpoint = split / "checkpoints" / "iter_000002"
    policy, critic = (
        stored(checkpoint / "policy.trained.safetensors"),
        stored(checkpoint / "critic.trained.safetensors"),
    )
    trainable = {n: p for n, p in first.runtime.roles.policy.model.named_parameters() if p.requires_grad}
    assert set(policy) == set(trainable) and all("lora_" in n for n in policy)
    assert all(policy[n].shape == p.shape for n, p in trainable.items())
    critic_trainable = {n for n, p in first.runtime.roles.critic.model.named_parameters() if p.requires_grad}
    assert set(critic) == critic_trainable and {"head.weight", "head.bias"} <= set(critic)
    assert (
        not (checkpoint / "policy.safetensors").exists() and not (checkpoint / "critic.safetensors").exists()
    )
    # the optimizer state: AdamW moments of the trained parameters only
    state = ckpt.load_state(checkpoint, "trainer")["roles"]["policy"]["optimizer"]["state"]
    moments = sorted(tuple(s["exp_avg"].shape) for s in state.values())
    assert moments == sorted(tuple(p.shape) for p in trainable.values())

    resumed = make_trainer(lora_config(split), run_dir=split, resume=True)
    resumed.train()
    assert metric_rows(split) == metric_rows(whole)
    for (name, want), (_, got) in zip(
        uninterrupted.runtime.roles.policy.model.state_dict().items(),
        resumed.runtime.roles.policy.model.state_dict().items(),
    ):
        assert torch.equal(got, want), name


def test_a_checkpoint_without_the_trained_parameters_stops_with_the_fix(make_trainer, tmp_path):
    """A checkpoint whose policy file is gone (or another format's) is refused, naming the file."""
    out = tmp_path / "run"
    run_until(make_trainer(lora_config(out), run_dir=out), 3)
    checkpoint = out / "checkpoints" / "iter_000002"
    (checkpoint / "policy.trained.safetensors").unlink()
    ckpt.write_done(checkpoint, 2)  # a complete checkpoint, of another format
    with pytest.raises(ConfigError, match="policy.trained.safetensors is missing.*Fix:"):
        make_trainer(lora_config(out), run_dir=out, resume=True)


def test_resuming_on_other_base_weights_stops_with_the_fix(make_trainer, tok, _models, tmp_path):
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    out = tmp_path / "run"
    run_until(make_trainer(lora_config(out), run_dir=out), 3)
    policy, reward_model = copy.deepcopy(_models)
    with torch.no_grad():
        policy.lm_head.weight.add_(0.01)  # another SFT model
    roles = assemble_roles(lora_config(out), tokenizer=tok, policy=policy, reward_model=reward_model)
    with pytest.raises(ConfigError, match="frozen weights differ.*same base model") as error:
        RLTrainer(
            lora_config(out),
            LocalRuntime(roles, lora_config(out).runtime),
            [[1, 2]],
            run_dir=out,
            resume=True,
        )
    assert "policy.trained.safetensors" in str(error.value)


def test_resuming_with_another_lora_rank_stops_with_the_fix(make_trainer, tmp_path):
    out = tmp_path / "run"
    run_until(make_trainer(lora_config(out), run_dir=out), 3)
    other = rl_config(
        "ppo_max",
        train={"iterations": ITERATIONS},
        checkpoint={"every": 2, "keep": 1},
        model={
            "lora": {"enabled": True, "r": 4, "target_modules": ["q_proj"]},
            "critic_lora": {"enabled": True, "r": 2},
        },
    )
    with pytest.raises(ConfigError, match="trained parameters do not match.*config.yaml"):
        make_trainer(other, run_dir=out, resume=True)
