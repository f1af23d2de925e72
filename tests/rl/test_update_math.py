"""Properties of the update that follow from the math: the first PPO ratio is 1, zero advantages
give zero policy gradient, APA regresses log-ratios onto A / lam, critic pre-training freezes the policy."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import masked_mean, policy_loss, value_loss
from rlhf.models.logprobs import response_logprobs
from rlhf.models.scalar_head import response_values
from rlhf.rl.experience import Experience
from tests.support.train_testing import max_change, metric_rows, params_of, rl_config


def fresh_logp(policy, exp: Experience) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(policy, exp.input_ids, exp.attention_mask, exp.prompt_length)[0]


@pytest.mark.parametrize("lora", [False, True])
def test_first_ratio_is_exactly_one(lora, make_trainer):
    # one minibatch in one micro-batch: the update's forward sees the rollout's rows (shuffled,
    # which changes no bit), so every ratio of the first epoch is exactly exp(0) = 1
    config = rl_config(
        "ppo_max", train={"minibatches": 1, "micro_batch_size": 8}, model={"lora": {"enabled": lora}}
    )
    trainer = make_trainer(config)
    exp, _ = trainer.make_experience()
    assert fresh_logp(trainer.runtime.roles.policy.model, exp).equal(exp.old_logp)
    assert 0 < float(exp.response_mask.sum()) < exp.response_mask.numel()  # mixed lengths, padded rows
    stats = trainer.update(exp, train_policy=True)
    assert stats["policy/ratio_min"] == stats["policy/ratio_max"] == stats["policy/ratio_mean"] == 1.0
    assert stats["policy/clip_fraction"] == 0.0 and stats["policy/approx_kl"] == 0.0
    # a second epoch sees the stepped policy: its ratios move away from 1
    stats = trainer.update(exp, train_policy=True)
    assert stats["policy/ratio_min"] < 1.0 < stats["policy/ratio_max"]


def test_first_ratio_is_one_up_to_rounding_on_regrouped_micro_batches(make_trainer):
    # other row groupings change float32 matmul blocking: equal up to rounding, not bitwise
    trainer = make_trainer(rl_config("ppo_max", train={"minibatches": 1, "micro_batch_size": 3}))
    exp, _ = trainer.make_experience()
    for minibatch in exp.minibatches(3, torch.Generator().manual_seed(0)):
        for micro in minibatch.micro_batches(2):
            torch.testing.assert_close(
                fresh_logp(trainer.runtime.roles.policy.model, micro), micro.old_logp, rtol=0, atol=1e-5
            )
    stats = trainer.update(exp, train_policy=True)
    assert stats["policy/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert stats["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)


def test_zero_advantages_without_kl_give_zero_policy_gradient(make_trainer):
    # kl.beta 0, and a critic from the SFT trunk: a zero value head
    trainer = make_trainer(
        rl_config("vanilla_ppo", train={"minibatches": 1}, model={"critic_init": "policy"})
    )
    exp, _ = trainer.make_experience()
    policy = trainer.runtime.roles.policy.model
    micro = exp.select(torch.arange(exp.batch_size))
    logp, _ = response_logprobs(policy, micro.input_ids, micro.attention_mask, micro.prompt_length)
    zeros = torch.zeros_like(micro.advantages)
    loss, _ = policy_loss(
        "ppo", logp, micro.old_logp, micro.ref_logp, zeros, micro.response_mask, clip_eps=0.2
    )
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())
    assert any(p.grad is not None for p in policy.parameters())
    policy.zero_grad(set_to_none=True)

    # end to end: a reward model scoring 0 everywhere and a zero critic head (critic from the
    # policy) make every reward, value and advantage 0, so a whole iteration leaves the policy as is
    with torch.no_grad():
        trainer.runtime.roles.reward_model.model.head.weight.zero_()
    before = params_of(policy)
    metrics = trainer.step()
    assert metrics["advantage/mean"] == 0.0 and metrics["policy/loss"] == 0.0
    assert max_change(before, policy) == 0.0


def test_apa_drives_log_ratio_towards_advantage_over_lam(make_trainer):
    config = rl_config(
        "apa",
        train={"minibatches": 1, "micro_batch_size": 8, "ppo_epochs": 1},
        advantage={"whiten": False},  # the target is the stored advantage over lam
        policy={"apa_lam": 1.0},
        policy_optim={"lr": 3e-3},
    )
    trainer = make_trainer(config)
    exp, _ = trainer.make_experience()
    target = exp.advantages / config.policy.apa_lam

    def residual() -> float:
        log_ratio = fresh_logp(trainer.runtime.roles.policy.model, exp) - exp.ref_logp
        return float(masked_mean((log_ratio - target) ** 2, exp.response_mask))

    history = [residual()]
    for _ in range(8):
        trainer.update(exp, train_policy=True)
        history.append(residual())
    assert history[0] > 0.1
    assert history[-1] < 0.5 * history[0], history
    assert all(b < a for a, b in zip(history, history[1:])), history


def test_critic_pretraining_lowers_value_loss_and_freezes_policy(make_trainer, tmp_path):
    config = rl_config(
        "ppo_max",
        train={"iterations": 0},
        critic={"pretrain_iterations": 4, "pretrain_patience": 10},
        critic_optim={"lr": 3e-3},
    )
    trainer = make_trainer(config)
    exp, _ = trainer.make_experience()  # a fixed batch to measure the value loss on

    def loss_on_exp() -> float:
        with torch.no_grad():
            values = response_values(
                trainer.runtime.roles.critic.model, exp.input_ids, exp.attention_mask, exp.prompt_length
            )
            return float(value_loss(values, exp.old_values, exp.returns, exp.response_mask)[0])

    policy_before, critic_before = (
        params_of(trainer.runtime.roles.policy.model),
        params_of(trainer.runtime.roles.critic.model),
    )
    loss_before = loss_on_exp()
    trainer.train()
    assert max_change(policy_before, trainer.runtime.roles.policy.model) == 0.0  # bitwise equal
    assert max_change(critic_before, trainer.runtime.roles.critic.model) > 0.0
    assert loss_on_exp() < 0.7 * loss_before
    rows = metric_rows(tmp_path / "run", kinds=("pretrain",))
    assert [r["pretrain"] for r in rows] == [0, 1, 2, 3]
    assert not metric_rows(tmp_path / "run", kinds=("iteration",))


def test_critic_pretraining_stops_when_the_value_loss_plateaus(make_trainer, tmp_path):
    # min_delta 1.0 counts no improvement after the first iteration; patience 2 stops after 3
    config = rl_config(
        "ppo_max",
        train={"iterations": 1},
        critic={"pretrain_iterations": 10, "pretrain_patience": 2, "pretrain_min_delta": 1.0},
    )
    make_trainer(config).train()
    assert [r["pretrain"] for r in metric_rows(tmp_path / "run", kinds=("pretrain",))] == [0, 1, 2]
    assert [r["iteration"] for r in metric_rows(tmp_path / "run", kinds=("iteration",))] == [0]
