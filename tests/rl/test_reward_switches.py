"""The reward-side switches of docs/algorithms.md §5-11 each change the experience as their formula says.

With gamma = lam = 1 the return at the first response token is the sum of the token rewards,
`processed_score - beta * sum_t kl_t`, so the processed scores and the KL term can be read back from
`Experience.returns[:, 0]` and checked against hand computations on the raw reward-model scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import masked_mean
from tests.support.train_testing import loop_gae, perturb, raw_scores, rl_config

MONTE_CARLO = {"gamma": 1.0, "lam": 1.0, "whiten": False}


def experience(make_trainer, *, perturb_policy: float = 0.0, **overrides):
    """(trainer, experience, metrics) of one rollout with the tiny vanilla_ppo config + `overrides`."""
    overrides.setdefault("advantage", MONTE_CARLO)
    trainer = make_trainer(rl_config("vanilla_ppo", **overrides))
    if perturb_policy:
        perturb(trainer.runtime.roles.policy.model, perturb_policy)  # old != ref, so the KL is not 0
    exp, metrics = trainer.make_experience()
    return trainer, exp, metrics


def summed_rewards(exp) -> torch.Tensor:
    return exp.returns[:, 0]


def test_raw_scores_pass_through_with_every_switch_off(make_trainer):
    trainer, exp, metrics = experience(make_trainer)
    raw = raw_scores(trainer, exp)
    assert raw.std() > 0.1  # the tiny reward model separates responses
    torch.testing.assert_close(summed_rewards(exp), raw, rtol=0, atol=1e-6)
    assert metrics["reward/raw_mean"] == pytest.approx(float(raw.mean()), abs=1e-6)


def test_reward_scale_divides_by_the_running_std(make_trainer):
    trainer, exp, metrics = experience(make_trainer, reward={"scale": True})
    raw = raw_scores(trainer, exp)
    torch.testing.assert_close(summed_rewards(exp), raw / raw.std(), rtol=1e-5, atol=1e-6)
    assert metrics["reward/processed_std"] == pytest.approx(1.0, abs=1e-5)


def test_reward_normalize_subtracts_the_running_mean(make_trainer):
    trainer, exp, _ = experience(make_trainer, reward={"normalize": True})
    raw = raw_scores(trainer, exp)
    torch.testing.assert_close(summed_rewards(exp), (raw - raw.mean()) / raw.std(), rtol=1e-5, atol=1e-6)


def test_reward_moments_run_over_batches(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", reward={"normalize": True}, advantage=MONTE_CARLO))
    first, _ = trainer.make_experience()
    second, _ = trainer.make_experience()
    seen = torch.cat([raw_scores(trainer, first), raw_scores(trainer, second)])
    expected = (raw_scores(trainer, second) - seen.mean()) / seen.std()  # moments of both batches
    torch.testing.assert_close(summed_rewards(second), expected, rtol=1e-5, atol=1e-6)


def test_reward_clip_bounds_the_raw_score(make_trainer):
    trainer, exp, _ = experience(make_trainer)
    bound = float(raw_scores(trainer, exp).abs().median())
    trainer, exp, _ = experience(make_trainer, reward={"clip": bound})
    raw = raw_scores(trainer, exp)
    assert bool((raw.abs() > bound).any())
    torch.testing.assert_close(summed_rewards(exp), raw.clamp(-bound, bound), rtol=0, atol=1e-6)


def test_reward_clip_applies_after_normalization(make_trainer):
    trainer, exp, _ = experience(make_trainer, reward={"normalize": True, "clip": 0.5})
    raw = raw_scores(trainer, exp)
    expected = ((raw - raw.mean()) / raw.std()).clamp(-0.5, 0.5)
    torch.testing.assert_close(summed_rewards(exp), expected, rtol=1e-5, atol=1e-6)


def test_reward_discounted_scaling_uses_the_std_of_discounted_sums(make_trainer):
    gamma = 0.5
    trainer, exp, _ = experience(
        make_trainer, reward={"scale": True, "discounted": True, "discount_gamma": gamma}
    )
    raw = raw_scores(trainer, exp)
    running, sums = 0.0, []
    for score in raw.tolist():  # R <- gamma * R + r over the score stream, row order
        running = gamma * running + score
        sums.append(running)
    expected = raw / torch.tensor(sums).std()
    torch.testing.assert_close(summed_rewards(exp), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(expected, raw / raw.std())


def kl_by_hand(exp, kind: str) -> torch.Tensor:
    """Per-token KL estimate (docs/algorithms.md §7) from the experience's log-probs, 0 at padding."""
    d = exp.old_logp - exp.ref_logp
    per_token = {"k1": d, "k2": d**2 / 2, "k3": torch.exp(-d) - 1 + d}[kind]
    return per_token * exp.response_mask


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_uses_the_configured_estimator(kind, make_trainer):
    beta = 0.3
    trainer, exp, metrics = experience(
        make_trainer, perturb_policy=0.05, kl={"beta": beta, "estimator": kind}
    )
    kl = kl_by_hand(exp, kind)
    assert float(kl.abs().sum()) > 0.1
    expected = raw_scores(trainer, exp) - beta * kl.sum(1)
    torch.testing.assert_close(summed_rewards(exp), expected, rtol=1e-5, atol=1e-5)
    assert metrics[f"kl/{kind}"] == pytest.approx(float(kl.sum(1).mean()), rel=1e-5)
    assert metrics["kl/ref"] == metrics[f"kl/{kind}"]
    assert metrics["kl/k3"] == pytest.approx(float(kl_by_hand(exp, "k3").sum(1).mean()), rel=1e-5)


def test_kl_estimators_give_different_rewards(make_trainer):
    returns = {
        kind: summed_rewards(
            experience(make_trainer, perturb_policy=0.05, kl={"beta": 0.3, "estimator": kind})[1]
        )
        for kind in ("k1", "k2", "k3")
    }
    assert not torch.allclose(returns["k1"], returns["k2"]) and not torch.allclose(
        returns["k2"], returns["k3"]
    )


def test_kl_beta_zero_leaves_no_penalty(make_trainer):
    trainer, exp, metrics = experience(make_trainer, perturb_policy=0.05, kl={"beta": 0.0})
    assert float(kl_by_hand(exp, "k1").abs().sum()) > 0.1
    torch.testing.assert_close(summed_rewards(exp), raw_scores(trainer, exp), rtol=0, atol=1e-6)
    assert metrics["kl/beta"] == 0.0


@pytest.mark.parametrize("adaptive", [False, True])
def test_kl_adaptive_controller_moves_beta(adaptive, make_trainer):
    beta, target, horizon = 0.1, 1.0, 16
    controller = {"target": target, "horizon": horizon} if adaptive else {}  # the controller's own settings
    config = rl_config("vanilla_ppo", kl={"beta": beta, "adaptive": adaptive, **controller})
    trainer = make_trainer(config)
    perturb(trainer.runtime.roles.policy.model, 0.05)
    metrics = trainer.step()
    assert metrics["kl/beta"] == beta  # the beta used for this iteration's rewards
    if adaptive:  # e = clip(KL / target - 1, +-0.2); beta *= 1 + e * n / horizon
        error = min(max(metrics["kl/ref"] / target - 1, -0.2), 0.2)
        assert error != 0
        assert trainer.kl_controller.value == pytest.approx(beta * (1 + error * 8 / horizon), rel=1e-9)
    else:
        assert trainer.kl_controller.value == beta


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (1.0, 0.0), (0.5, 1.0), (0.9, 0.7)])
def test_advantages_follow_gae_with_the_configured_gamma_and_lam(gamma, lam, make_trainer):
    config = {"gamma": gamma, "lam": lam, "whiten": False}
    trainer, exp, _ = experience(make_trainer, advantage=config, model={"critic_init": "reward_model"})
    assert float(exp.old_values.abs().sum()) > 0  # a critic from the reward model: V != 0
    mask = exp.response_mask
    last = (mask.sum(1) - 1).long()
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(last)), last] = raw_scores(trainer, exp)  # beta 0: the score at the EOS
    advantages, returns = loop_gae(rewards, exp.old_values, mask, gamma, lam)
    torch.testing.assert_close(exp.advantages, advantages, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(exp.returns, returns, rtol=1e-5, atol=1e-5)


def first_update_loss(make_trainer, **advantage) -> tuple[float, object]:
    """The PPO loss of a single-minibatch, single-epoch update (ratio 1, so loss = -mean(A used))."""
    config = rl_config(
        "vanilla_ppo",
        train={"minibatches": 1},
        advantage={"gamma": 1.0, "lam": 0.95, **advantage},
        model={"critic_init": "reward_model"},
    )
    trainer = make_trainer(config)
    exp, _ = trainer.make_experience()
    return trainer.update(exp, train_policy=True)["policy/loss"], exp


def test_advantage_whiten_centres_the_advantages(make_trainer):
    raw_loss, exp = first_update_loss(make_trainer, whiten=False)
    assert raw_loss == pytest.approx(-float(masked_mean(exp.advantages, exp.response_mask)), abs=1e-5)
    assert abs(raw_loss) > 0.05
    whitened_loss, _ = first_update_loss(make_trainer, whiten=True)
    assert whitened_loss == pytest.approx(0.0, abs=1e-5)  # whitened advantages have mean 0


@pytest.mark.parametrize("whiten", [False, True])
def test_advantage_clip_bounds_the_advantages(whiten, make_trainer):
    _, exp = first_update_loss(make_trainer, whiten=whiten)
    mask = exp.response_mask
    adv = exp.advantages
    if whiten:
        valid = adv[mask.bool()]
        adv = (adv - valid.mean()) / math.sqrt(float(valid.var()) + 1e-8)
    bound = 0.4
    expected = -float(masked_mean(adv.clamp(-bound, bound), mask))
    clipped_loss, _ = first_update_loss(make_trainer, whiten=whiten, clip=bound)
    assert clipped_loss == pytest.approx(expected, abs=1e-5)
    unclipped_loss, _ = first_update_loss(make_trainer, whiten=whiten)
    assert clipped_loss != pytest.approx(unclipped_loss, abs=1e-4)


@pytest.mark.parametrize("policy", ["keep", "penalize", "drop"])
def test_truncated_responses(policy, make_trainer):
    penalty = -3.0
    penalized = {"truncation_penalty": penalty} if policy == "penalize" else {}  # applies to penalize only
    trainer, exp, metrics = experience(
        make_trainer, rollout={"max_new_tokens": 2, "truncated": policy, **penalized}
    )
    raw = raw_scores(trainer, exp)
    ids, attn, prompt = exp.input_ids, exp.attention_mask, exp.prompt_length
    ended = (ids[:, prompt:] == trainer.runtime.roles.tokenizer.eos_token_id) & attn[:, prompt:].bool()
    ended = ended.any(1)
    assert 0 < int(ended.sum()) < len(ended)  # some responses hit the 2-token limit, some ended
    assert metrics["response/eos_rate"] == pytest.approx(float(ended.float().mean()))
    got = summed_rewards(exp)
    if policy == "keep":
        torch.testing.assert_close(got, raw, rtol=0, atol=1e-6)
    elif policy == "penalize":
        torch.testing.assert_close(
            got, torch.where(ended, raw, torch.full_like(raw, penalty)), rtol=0, atol=1e-6
        )
    else:  # dropped rows leave the update: no token, no advantage
        assert exp.response_mask[~ended].sum() == 0 and exp.advantages[~ended].abs().sum() == 0
        assert exp.response_mask[ended].sum() > 0
        torch.testing.assert_close(got[ended], raw[ended], rtol=0, atol=1e-6)


def test_rollout_stop_at_eos_off_gives_full_length_responses(make_trainer):
    stopping = make_trainer(rl_config("vanilla_ppo"))
    _, metrics = stopping.make_experience()
    assert metrics["response/eos_rate"] > 0  # the fixture's policy ends about half its answers early
    full = make_trainer(rl_config("vanilla_ppo", rollout={"stop_at_eos": False}))
    experience, metrics = full.make_experience()
    budget = full.config.rollout.max_new_tokens
    assert metrics["response/length_mean"] == metrics["response/length_max"] == budget
    assert experience.response_mask.sum(1).eq(budget).all()
