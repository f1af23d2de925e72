"""Environment tokens are never trained on: in the trainer's experience of a multi-turn rollout
they carry no mask, advantage or return; the policy loss (PPO, APA, AWR, with the entropy bonus
and the KL loss) and the value loss put exactly zero gradient on the logits and values that score
them, and no value at their positions moves any loss. Every preset trains on such rollouts."""

from __future__ import annotations

import pytest
import torch

from rlhf.rl.roles.policy import value_micro_loss
from rlhf.train.micro_batches import MicroBatch
from rlhf.train.step_stats import StepStats
from tests.rl.test_resume import Interrupted, interrupt_at
from tests.support.train_testing import metric_rows, rl_config

ECHO = {"name": "tests.support.envs_testing:Echo", "max_turns": 3}
GROUPS = {"rollout": {"batch_size": 4, "samples_per_prompt": 2}}


def env_positions(experience) -> torch.Tensor:
    """[B, T] bool: the response block's real tokens that are not the policy's (the replies)."""
    real = experience.attention_mask[:, experience.prompt_length :].bool()
    return real & ~experience.response_mask.bool()


def experience_of(make_trainer, preset: str, **overrides):
    trainer = make_trainer(
        rl_config(preset, GROUPS if preset != "vanilla_ppo" else {}, env=ECHO, **overrides)
    )
    experience, metrics = trainer.make_experience()
    assert env_positions(experience).any(), "the rollout must hold environment tokens"
    # out of inference mode, as the update's minibatches are (`select`)
    return trainer, experience.select(torch.arange(experience.batch_size)), metrics


@pytest.mark.parametrize("preset", ["vanilla_ppo", "grpo"])
def test_the_experience_of_episodes_carries_nothing_on_environment_tokens(make_trainer, preset):
    trainer, experience, metrics = experience_of(make_trainer, preset)
    env = env_positions(experience)
    for name in ("response_mask", "advantages", "returns"):
        assert not getattr(experience, name)[env].any(), name
    assert metrics["env/turns_mean"] > 1 and metrics["env/reply_tokens_mean"] > 0
    episodes = trainer.rollouts.episodes  # the reward model's score plus the environment's turn rewards
    model_scores = trainer.runtime.forward("reward_model", episodes.rollout.sequences)
    raw = torch.tensor(metrics["reward/raw_scores"])
    assert torch.allclose(raw - model_scores, episodes.rewards, atol=1e-5)
    assert torch.equal(episodes.rewards, episodes.turn_rewards.sum(-1)) and episodes.rewards.sum() > 0


def policy_loss_of(policy, experience) -> torch.Tensor:
    """The policy's loss terms on the whole batch as one micro-batch (rlhf/rl/roles/policy.py)."""
    micro = MicroBatch(experience, 1.0, list(range(experience.batch_size)))
    return policy.policy_terms(micro, StepStats())


class Logits:
    """Keeps the policy head's outputs with their gradients (the head may run in chunks of columns)."""

    def __init__(self, head: torch.nn.Module):
        self.outputs: list[torch.Tensor] = []
        self.handle = head.register_forward_hook(self.keep)

    def keep(self, module, args, output):
        output.retain_grad()
        self.outputs.append(output)

    def grad(self) -> torch.Tensor:
        return torch.cat([o.grad for o in self.outputs], dim=1)  # [B, T, V]: column t scores token t


@pytest.mark.parametrize("loss", ["ppo", "apa", "awr"])
def test_the_policy_loss_puts_no_gradient_on_logits_of_environment_tokens(make_trainer, loss):
    trainer, experience, _ = experience_of(
        make_trainer, "grpo", policy={"loss": loss, "entropy_coef": 0.01, "kl_loss_coef": 0.1}
    )
    policy = trainer.runtime.roles.policy
    logits = Logits(policy.model.lm_head)
    policy_loss_of(policy, experience).backward()
    logits.handle.remove()
    grad = logits.grad().abs().sum(-1)  # [B, T]
    env = env_positions(experience)
    assert grad.shape == env.shape
    assert torch.all(grad[env] == 0.0)  # exactly: the replies are never trained on
    assert (grad[experience.response_mask.bool()] > 0).float().mean() > 0.5  # the policy's tokens are


def test_the_value_loss_puts_no_gradient_on_values_at_environment_tokens(make_trainer):
    trainer, experience, _ = experience_of(make_trainer, "vanilla_ppo")
    critic, kept = trainer.runtime.roles.critic, []

    def forward(sequences):
        values = critic.learner.train_forward(sequences)
        values.retain_grad()
        kept.append(values)
        return values

    value_micro_loss(forward, experience, 0.2, StepStats(), 1.0).backward()
    env = env_positions(experience)
    assert (
        torch.all(kept[0].grad[env] == 0.0) and kept[0].grad[experience.response_mask.bool()].abs().sum() > 0
    )


@pytest.mark.parametrize("loss", ["ppo", "apa", "awr"])
def test_no_value_at_environment_positions_moves_a_loss(make_trainer, loss):
    """Old and reference log-probs, advantages, returns and old values set to anything (NaN
    included) on the replies: the policy and value losses are bitwise the same."""
    trainer, experience, _ = experience_of(
        make_trainer, "vanilla_ppo", policy={"loss": loss, "entropy_coef": 0.01, "kl_loss_coef": 0.1}
    )
    env = env_positions(experience)
    changed = experience.select(torch.arange(experience.batch_size))
    for name, value in (("old_logp", 5.0), ("ref_logp", float("nan")), ("advantages", 1e6),
                        ("returns", -3.0), ("old_values", float("inf"))):  # fmt: skip
        getattr(changed, name)[env] = value
    policy, critic = trainer.runtime.roles.policy, trainer.runtime.roles.critic
    with torch.no_grad():
        for a, b in ((experience, changed),):
            torch.manual_seed(0)
            before = policy_loss_of(policy, a)
            torch.manual_seed(0)
            after = policy_loss_of(policy, b)
            assert torch.equal(before, after)
            value_a = value_micro_loss(critic.learner.train_forward, a, 0.2, StepStats(), 1.0)
            value_b = value_micro_loss(critic.learner.train_forward, b, 0.2, StepStats(), 1.0)
            assert torch.equal(value_a, value_b)


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("vanilla_ppo", {}),
        ("ppo_max", {}),
        ("apa", {}),
        ("awr", {}),
        ("grpo", GROUPS),
        ("rloo", GROUPS),
        ("reinforce_pp", {}),
        ("grpo", {**GROUPS, "advantage": {"estimator": "dr_grpo"}}),
        ("vanilla_ppo", {"env": {"reward_placement": "turn"}}),
    ],
)
def test_every_preset_trains_on_episodes(make_trainer, preset, extra):
    config = rl_config(preset, {"env": ECHO}, extra, train={"iterations": 1})
    trainer = make_trainer(config)
    before = [p.detach().clone() for p in trainer.runtime.roles.policy.model.parameters()]
    metrics = trainer.step()
    assert metrics["env/turns_mean"] > 1
    moved = [not torch.equal(b, p) for b, p in zip(before, trainer.runtime.roles.policy.model.parameters())]
    assert any(moved)


@pytest.mark.slow
def test_a_run_on_episodes_resumes_to_identical_metrics(make_trainer, tmp_path):
    """Interrupted after its checkpoint at iteration 2 and resumed, a run on episodes logs what the
    uninterrupted one logs (the environments are rebuilt from the rows; the sampling state is the
    policy's, in the checkpoint)."""

    def config(out):
        return rl_config("vanilla_ppo", out=out, env={**ECHO, "reward_placement": "turn"},
                         train={"iterations": 3}, checkpoint={"every": 2, "keep": 1})  # fmt: skip

    whole, split = tmp_path / "whole", tmp_path / "split"
    make_trainer(config(whole), run_dir=whole).train()
    first = make_trainer(config(split), run_dir=split)
    interrupt_at(first, 2)
    with pytest.raises(Interrupted):
        first.train()
    make_trainer(config(split), run_dir=split, resume=True).train()
    expected, got = metric_rows(whole), metric_rows(split)
    assert [r["iteration"] for r in got] == [0, 1, 2] and all("env/turns_mean" in r for r in got)
    assert got == expected
