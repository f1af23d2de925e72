"""The update-side switches of docs/algorithms.md §12-21 and the trainer's structure switches each
change what the update does, checked against hand computations on one experience."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import masked_mean
from rlhf.models.loading import load_causal_lm
from rlhf.models.logprobs import response_logprobs
from rlhf.models.scalar_head import response_values
from rlhf.stages.prompt_files import ptx_sampler
from rlhf.train.lm_loss import model_token_nll
from tests.support.train_testing import (
    WORDS,
    max_change,
    metric_rows,
    params_of,
    perturb,
    rl_config,
    write_jsonl,
)

# one minibatch in one micro-batch, raw advantages: the first update's stats are closed forms
ONE_BATCH = {"train": {"minibatches": 1, "micro_batch_size": 8}, "advantage": {"whiten": False}}


def logp_of(policy, exp, with_entropy: bool = False):
    with torch.no_grad():
        logp, entropy = response_logprobs(
            policy, exp.input_ids, exp.attention_mask, exp.prompt_length, with_entropy=with_entropy
        )
    return (logp, entropy) if with_entropy else logp


def zero_advantage_trainer(make_trainer, **overrides):
    """vanilla_ppo (beta 0) with a critic from the SFT trunk (zero head) and a reward model scoring 0:
    every advantage is 0."""
    trainer = make_trainer(
        rl_config("vanilla_ppo", ONE_BATCH, {"model": {"critic_init": "policy"}}, **overrides)
    )
    with torch.no_grad():
        trainer.runtime.roles.reward_model.model.head.weight.zero_()
    return trainer


# -- policy losses ---------------------------------------------------------------------------------
OWN_SETTINGS = {
    "apa": {"apa_lam": 0.5},
    "awr": {"awr_lam": 2.0, "awr_max_weight": 1.5},
}  # each loss reads its own


@pytest.mark.parametrize("loss", ["ppo", "apa", "awr"])
def test_policy_loss_switch_selects_the_formula(loss, make_trainer):
    config = rl_config(
        "vanilla_ppo",
        ONE_BATCH,
        model={"critic_init": "reward_model"},
        policy={"loss": loss, **OWN_SETTINGS.get(loss, {})},
    )
    trainer = make_trainer(config)
    exp, _ = trainer.make_experience()
    adv, mask = exp.advantages, exp.response_mask
    assert float(exp.old_logp.sub(exp.ref_logp).abs().max()) == 0.0  # policy == reference at the start
    expected = {  # at the first step logp = old_logp = ref_logp
        "ppo": -masked_mean(adv, mask),
        "apa": masked_mean((adv / 0.5) ** 2, mask),
        "awr": masked_mean(-torch.exp(adv / 2.0).clamp(max=1.5) * exp.old_logp, mask),
    }[loss]
    stats = trainer.update(exp, train_policy=True)
    assert stats["policy/loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-6)
    if loss == "awr":
        assert 0 < stats["policy/weight_clip_fraction"] < 1  # the max weight bites on some tokens


def perturbed_update(make_trainer, *, scale: float = 0.1, **policy):
    """(stats, exp, ratio) of an update whose policy was moved away from the one that sampled."""
    trainer = make_trainer(
        rl_config("vanilla_ppo", ONE_BATCH, model={"critic_init": "reward_model"}, policy=policy)
    )
    exp, _ = trainer.make_experience()
    perturb(trainer.runtime.roles.policy.model, scale)
    ratio = torch.exp(logp_of(trainer.runtime.roles.policy.model, exp) - exp.old_logp)
    return trainer.update(exp, train_policy=True), exp, ratio


@pytest.mark.parametrize("eps", [0.02, 0.2])
def test_clip_eps_sets_the_clip_fraction(eps, make_trainer):
    stats, exp, ratio = perturbed_update(make_trainer, clip_eps=eps)
    adv, mask = exp.advantages, exp.response_mask
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    expected = float(masked_mean(clipped.float(), mask))
    assert 0 < expected < 1
    assert stats["policy/clip_fraction"] == pytest.approx(expected, abs=1e-6)


def test_dual_clip_caps_negative_advantage_tokens(make_trainer):
    c = 1.3
    plain, _, _ = perturbed_update(make_trainer, scale=0.3)
    stats, exp, ratio = perturbed_update(make_trainer, scale=0.3, dual_clip=c)
    capped = (exp.advantages < 0) & (ratio > c)  # for A < 0 the PPO term |A| max(r, clip r) exceeds c |A|
    expected = float(masked_mean(capped.float(), exp.response_mask))
    assert expected > 0
    assert stats["policy/dual_clip_fraction"] == pytest.approx(expected, abs=1e-6)
    assert plain["policy/dual_clip_fraction"] == 0.0
    assert stats["policy/loss"] < plain["policy/loss"]  # the cap only lowers token losses


@pytest.mark.parametrize("against", ["old", "ref"])
def test_ratio_against_picks_the_denominator(against, make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", ONE_BATCH, policy={"ratio_against": against}))
    perturb(trainer.runtime.roles.policy.model, 0.1)  # the behaviour policy now differs from the reference
    exp, _ = trainer.make_experience()
    stats = trainer.update(exp, train_policy=True)
    if against == "old":
        assert stats["policy/ratio_min"] == stats["policy/ratio_max"] == 1.0
    else:
        expected = masked_mean(torch.exp(exp.old_logp - exp.ref_logp), exp.response_mask)
        assert abs(float(expected) - 1) > 0.01
        assert stats["policy/ratio_mean"] == pytest.approx(float(expected), rel=1e-5)


def test_entropy_bonus_raises_the_entropy(make_trainer):
    trainer = zero_advantage_trainer(make_trainer, policy={"entropy_coef": 1.0})
    exp, _ = trainer.make_experience()
    assert float(exp.advantages.abs().max()) == 0.0

    def mean_entropy() -> float:
        return float(
            masked_mean(
                logp_of(trainer.runtime.roles.policy.model, exp, with_entropy=True)[1], exp.response_mask
            )
        )

    before = mean_entropy()
    for _ in range(3):
        stats = trainer.update(exp, train_policy=True)
    assert stats["policy/loss"] == 0.0  # the surrogate has no gradient: only the bonus moves the policy
    assert mean_entropy() > before + 1e-3


def entropy_target_gradient(make_trainer, micro_batch_size: int, target_shift: float, clip: float):
    """(gradient train_step leaves, gradient of the closed form, H before) with zero advantages, the
    target at H + target_shift, where H is the minibatch's token-mean entropy before the step."""
    probe = zero_advantage_trainer(make_trainer)
    exp, _ = probe.make_experience()
    policy = probe.runtime.roles.policy.model
    _, entropy = response_logprobs(  # clones: the experience holds inference tensors
        policy, exp.input_ids.clone(), exp.attention_mask.clone(), exp.prompt_length, with_entropy=True
    )
    h = masked_mean(entropy, exp.response_mask.clone())  # the whole minibatch in one pass: the reference
    coef, target = 0.5, float(h.detach()) + target_shift
    policy.zero_grad(set_to_none=True)
    (coef * ((h - target).abs() - clip).clamp_min(0.0)).backward()  # PPO paper appendix B.3
    expected = {
        n: (q.grad.clone() if q.grad is not None else torch.zeros_like(q))
        for n, q in policy.named_parameters()
    }
    policy.zero_grad(set_to_none=True)

    trainer = zero_advantage_trainer(
        make_trainer,
        train={"micro_batch_size": micro_batch_size},
        policy={"entropy_coef": coef, "entropy_target": target, "entropy_clip": clip},
    )
    role = trainer.runtime.roles.policy
    role.learner.optimizer_step = lambda: 0.0  # keep the gradients
    stats = role.train_step(exp, exp.num_tokens)
    got = {
        n: (q.grad if q.grad is not None else torch.zeros_like(q)) for n, q in role.model.named_parameters()
    }
    assert stats["policy/entropy_target_loss"] == pytest.approx(max(abs(target_shift) - clip, 0.0), abs=1e-5)
    return got, expected


@pytest.mark.parametrize("micro_batch_size", [8, 3])
@pytest.mark.parametrize(("target_shift", "clip"), [(-0.5, 0.0), (0.5, 0.0), (0.5, 0.2), (0.3, 0.6)])
def test_entropy_target_gives_the_closed_form_gradient_of_the_whole_minibatch(
    make_trainer, micro_batch_size, target_shift, clip
):
    """entropy_coef * max(|H - target| - clip, 0) on the minibatch's mean entropy H, whatever the
    micro-batches: above the target it lowers H, below raises it, inside the region nothing."""
    got, expected = entropy_target_gradient(make_trainer, micro_batch_size, target_shift, clip)
    assert expected.keys() == got.keys()
    if abs(target_shift) <= clip:
        assert all(float(g.abs().max()) == 0.0 for g in got.values())
    else:
        assert any(float(e.abs().max()) > 0 for e in expected.values())
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-7)


@pytest.fixture()
def ptx_rows(tmp_path):
    rows = [
        {"prompt": " ".join(WORDS[i : i + 2]), "response": " ".join(WORDS[i + 2 : i + 5])} for i in range(6)
    ]
    return str(write_jsonl(tmp_path / "ptx.jsonl", rows))


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_ptx_loss_trains_on_the_sft_batch(coef, make_trainer, tok, ptx_rows, tmp_path):
    config = rl_config(  # critic from the SFT trunk: a zero value head
        "vanilla_ppo",
        ONE_BATCH,
        train={"iterations": 1},
        policy={"ptx_coef": coef},
        model={"critic_init": "policy"},
    )
    draw = ptx_sampler(tok, ptx_rows, batch_size=3, max_prompt_tokens=8)
    trainer = make_trainer(config, ptx=draw)
    with torch.no_grad():
        trainer.runtime.roles.reward_model.model.head.weight.zero_()  # zero advantages: only ptx can move the policy
    batch = draw.draw(torch.Generator().manual_seed(config.seed + 3))  # the trainer's ptx generator
    with torch.no_grad():
        nll, count = model_token_nll(
            trainer.runtime.roles.policy.model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["loss_mask"],
        )
    before = params_of(trainer.runtime.roles.policy.model)
    trainer.train()
    row = metric_rows(tmp_path / "run")[0]
    if coef:
        assert row["ptx/loss"] == pytest.approx(float(nll) / count, rel=1e-5)
        assert max_change(before, trainer.runtime.roles.policy.model) > 0
    else:
        assert "ptx/loss" not in row
        assert max_change(before, trainer.runtime.roles.policy.model) == 0.0


def test_ptx_coef_without_data_warns(make_trainer, tmp_path):
    make_trainer(rl_config("vanilla_ppo", train={"iterations": 1}, policy={"ptx_coef": 0.5})).train()
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "PPO-ptx is off: policy.ptx_coef > 0 but no data.ptx was given" in text


# -- critic ------------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", [None, 1e-3])
def test_value_clip_limits_the_value_step(clip, make_trainer):
    trainer = make_trainer(rl_config("ppo_max", ONE_BATCH, critic={"value_clip": clip}))
    exp, _ = trainer.make_experience()
    first = trainer.update(exp, train_policy=True)
    assert first["value/value_clip_fraction"] == 0.0  # V = V_old before the first step
    second = trainer.update(exp, train_policy=True)  # a second epoch: V has left the clip range
    if clip is None:
        assert second["value/value_clip_fraction"] == 0.0
    else:
        assert second["value/value_clip_fraction"] > 0.5


@pytest.mark.parametrize("init", ["reward_model", "policy"])
def test_critic_init(init, make_trainer):
    trainer = make_trainer(rl_config("ppo_max", model={"critic_init": init}))
    critic, rm, policy = (
        trainer.runtime.roles.critic.model,
        trainer.runtime.roles.reward_model.model,
        trainer.runtime.roles.policy.model,
    )
    exp, metrics = trainer.make_experience()
    if init == "reward_model":  # a copy of the reward model, head included (PPO paper §5.3.3)
        assert critic is not rm
        assert all(p.equal(q) for p, q in zip(critic.parameters(), rm.parameters(), strict=True))
        with torch.no_grad():
            rm_values = response_values(rm, exp.input_ids, exp.attention_mask, exp.prompt_length)
            rm_scores = rm.score(exp.input_ids, exp.attention_mask)
            full = critic(exp.input_ids, exp.attention_mask)
        torch.testing.assert_close(exp.old_values, rm_values, rtol=0, atol=1e-5)
        last = exp.attention_mask.shape[1] - 1 - exp.attention_mask.flip(1).argmax(1)
        torch.testing.assert_close(full.gather(1, last[:, None]).squeeze(1), rm_scores, rtol=0, atol=1e-5)
    else:  # the SFT trunk with a zero head: V = 0 everywhere at the start
        assert float(exp.old_values.abs().max()) == 0.0 and metrics["value/mean"] == 0.0
        trunk = dict(critic.causal_lm.named_parameters())
        assert all(trunk[n].equal(p) for n, p in policy.named_parameters())
        assert trunk["lm_head.weight"] is not dict(policy.named_parameters())["lm_head.weight"]


def test_shared_critic_is_a_head_on_the_policy_trunk(make_trainer, tmp_path):
    config = rl_config("vanilla_ppo", model={"critic_mode": "shared"}, train={"iterations": 1})
    trainer = make_trainer(config)
    assert trainer.runtime.roles.critic.model.causal_lm is trainer.runtime.roles.policy.model
    assert not hasattr(trainer, "critic_opt")
    head_before = params_of(trainer.runtime.roles.critic.model.head)
    trainer.train()
    assert max_change(head_before, trainer.runtime.roles.critic.model.head) > 0  # the value head learns
    assert not (tmp_path / "run" / "critic").exists()
    assert "value/loss" in metric_rows(tmp_path / "run")[0]


def test_shared_critic_pretraining_trains_only_the_head(make_trainer):
    config = rl_config(
        "vanilla_ppo",
        model={"critic_mode": "shared"},
        train={"iterations": 0},
        critic={"pretrain_iterations": 2, "pretrain_patience": 5},
    )
    trainer = make_trainer(config)
    policy_before, head_before = (
        params_of(trainer.runtime.roles.policy.model),
        params_of(trainer.runtime.roles.critic.model.head),
    )
    trainer.train()
    assert max_change(policy_before, trainer.runtime.roles.policy.model) == 0.0
    assert max_change(head_before, trainer.runtime.roles.critic.model.head) > 0


# -- optimization structure ----------------------------------------------------------------------
def record_steps(optimizer) -> list[float]:
    """Record the global gradient norm that each `optimizer.step()` applies (a step pre-hook)."""
    norms: list[float] = []

    def hook(opt, args, kwargs):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    optimizer.register_step_pre_hook(hook)
    return norms


@pytest.mark.parametrize("max_norm", [None, 0.05])
def test_max_grad_norm_clips_policy_and_critic(max_norm, make_trainer):
    config = rl_config(
        "vanilla_ppo",
        train={"iterations": 1},
        policy_optim={"max_grad_norm": max_norm},
        critic_optim={"max_grad_norm": max_norm},
    )
    trainer = make_trainer(config)
    policy_norms, critic_norms = (
        record_steps(trainer.runtime.roles.policy.learner.optimizer.adamw),
        record_steps(trainer.runtime.roles.critic.learner.optimizer.adamw),
    )
    metrics = trainer.step()
    assert len(policy_norms) == len(critic_norms) == config.train.minibatches
    pre_clip = {"policy": metrics["policy/grad_norm"], "value": metrics["value/grad_norm"]}
    for name, applied in (("policy", policy_norms), ("value", critic_norms)):
        assert pre_clip[name] > 0.1
        if max_norm is None:
            assert sum(applied) / len(applied) == pytest.approx(pre_clip[name], rel=1e-5)
        else:
            assert max(applied) == pytest.approx(max_norm, rel=1e-4)


@pytest.mark.parametrize("buffer_size", [1, 2, 3])
def test_buffer_size_reuses_earlier_rollouts(buffer_size, make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", train={"iterations": 4, "buffer_size": buffer_size}))
    rows_seen: list[int] = []
    original = trainer.update

    def update(experience, *, train_policy=True):
        rows_seen.append(experience.batch_size)
        return original(experience, train_policy=train_policy)

    trainer.update = update
    trainer.train()
    assert rows_seen == [8 * min(i + 1, buffer_size) for i in range(4)]


@pytest.mark.parametrize(("epochs", "minibatches"), [(1, 1), (2, 3)])
def test_epochs_and_minibatches_set_the_optimizer_step_count(epochs, minibatches, make_trainer):
    config = rl_config(
        "ppo_max",
        train={"iterations": 2, "ppo_epochs": epochs, "minibatches": minibatches},
        critic={"pretrain_iterations": 1, "pretrain_patience": 5},
    )
    trainer = make_trainer(config)
    policy_norms, critic_norms = (
        record_steps(trainer.runtime.roles.policy.learner.optimizer.adamw),
        record_steps(trainer.runtime.roles.critic.learner.optimizer.adamw),
    )
    trainer.train()
    assert len(policy_norms) == 2 * epochs * minibatches
    assert len(critic_norms) == 3 * epochs * minibatches  # + the pre-training iteration


def test_lora_policy_uses_the_disabled_adapter_as_reference(make_trainer, tmp_path):
    config = rl_config("ppo_max", train={"iterations": 1}, model={"lora": {"enabled": True, "r": 4}})
    trainer = make_trainer(config)
    policy, reference = trainer.runtime.roles.policy.model, trainer.runtime.roles.reference.reference
    assert reference.mode == "adapter" and reference.model is policy  # no second copy of the weights
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    exp, _ = trainer.make_experience()
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    trainer.train()
    assert all(p.equal(base_before[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    with torch.no_grad():
        ref_now = reference.logprobs(exp.input_ids, exp.attention_mask, exp.prompt_length)
    torch.testing.assert_close(ref_now, exp.ref_logp, rtol=0, atol=1e-6)  # the reference did not move
    trained = logp_of(policy, exp)
    assert float((trained - exp.old_logp).abs().max()) > 1e-3  # the policy did
    merged = load_causal_lm(tmp_path / "run")  # the export merges the adapter
    torch.testing.assert_close(logp_of(merged, exp), trained, rtol=0, atol=1e-5)


def test_log_every_thins_the_records_but_keeps_the_last(make_trainer, tmp_path):
    make_trainer(rl_config("vanilla_ppo", train={"iterations": 4}, log={"every": 3})).train()
    assert [r["iteration"] for r in metric_rows(tmp_path / "run")] == [0, 3]


def test_entropy_and_losses_are_finite_with_a_fully_dropped_batch(make_trainer):
    # every response truncated and dropped: no token reaches the update, nothing may turn NaN
    trainer = make_trainer(rl_config("vanilla_ppo", rollout={"max_new_tokens": 1, "truncated": "drop"}))
    with torch.no_grad():  # EOS logit 0 far below the best of the other (scaled-up) logits: never sampled
        trainer.runtime.roles.policy.model.lm_head.weight.mul_(100.0)[
            trainer.runtime.roles.tokenizer.eos_token_id
        ] = 0.0
    before = params_of(trainer.runtime.roles.policy.model)
    metrics = trainer.step()
    assert metrics["response/eos_rate"] == 0.0
    numbers = {k: v for k, v in metrics.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    assert max_change(before, trainer.runtime.roles.policy.model) == 0.0


def test_critic_lora_trains_adapters_and_head_only(make_trainer):
    trainer = make_trainer(rl_config("ppo_max", model={"critic_lora": {"enabled": True, "r": 2}}))
    critic = trainer.runtime.roles.critic.model
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable)
    assert any(name.startswith("head.") for name in trainable)
    frozen = {name: p.detach().clone() for name, p in critic.named_parameters() if not p.requires_grad}
    trainer.step()
    assert all(torch.equal(p, frozen[name]) for name, p in critic.named_parameters() if name in frozen)
