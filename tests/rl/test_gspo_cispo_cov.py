"""GSPO's row mean and CISPO's token mean through the policy's step: the same loss value and gradient
for any split into micro-batches and between workers (docs/algorithms.md §18, §41-42), and
Clip-Cov/KL-Cov's selection made once per minibatch (§43)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import loss_unit_count, policy_loss
from tests.support.train_testing import rl_config

SMALL = {"rollout": {"batch_size": 4, "samples_per_prompt": 2}, "train": {"minibatches": 1}}  # 8 rows


def _step(policy, batches, **totals) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The gradients `train_step` leaves on `batches` (its optimizer not stepping) and its stats."""
    policy.learner.optimizer_step = lambda: 0.0
    stats = [policy.train_step(batch, **totals) for batch in batches]
    return {
        n: q.grad.clone() for n, q in policy.learner.module.named_parameters() if q.grad is not None
    }, stats


def _experience(trainer):
    experience, _ = trainer.make_experience()
    experience = experience.select(torch.arange(experience.batch_size))  # out of inference mode
    g = torch.Generator().manual_seed(0)
    experience.advantages = torch.randn(experience.advantages.shape, generator=g) * experience.response_mask
    experience.old_logp = experience.old_logp + 0.05 * torch.randn(experience.old_logp.shape, generator=g)
    experience.response_mask[2] = 0  # a fully masked row
    return experience


@pytest.mark.parametrize("preset", ["gspo", "cispo"])
def test_the_step_is_the_same_for_any_micro_batch_split_and_between_workers(make_trainer, preset):
    clip = {
        "clip_eps_high": 0.04,
        **({"clip_eps": 0.03} if preset == "gspo" else {}),
    }  # cispo reads no clip_eps
    base = rl_config(preset, SMALL, train={"micro_batch_size": 8}, policy=clip)
    trainer = make_trainer(base)
    experience = _experience(trainer)
    whole, whole_stats = _step(trainer.runtime.roles.policy, [experience])
    # the closed form: one forward of the whole minibatch through the loss itself
    policy = make_trainer(base, run_dir=trainer.run_dir.parent / "closed").runtime.roles.policy
    logp, _ = policy.forward(experience.sequences, policy.sampling.temperature, with_entropy=True)
    params = {"clip_eps": 0.03, "clip_eps_high": 0.04} if preset == "gspo" else {"clip_eps_high": 0.04}
    loss, _ = policy_loss(preset, logp, experience.old_logp, experience.ref_logp, experience.advantages,
                          experience.response_mask, **params)  # fmt: skip
    assert experience.batch_size == 8
    tokens = experience.response_mask.sum(1)
    assert len(set(tokens[tokens > 0].tolist())) > 1  # unequal rows: token and row weights differ
    assert whole_stats[0]["policy/loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for size in (1, 2, 4):
        config = rl_config(preset, SMALL, train={"micro_batch_size": size}, policy=params)
        split = make_trainer(config, run_dir=trainer.run_dir.parent / f"split{size}").runtime.roles.policy
        got, stats = _step(split, [experience])
        assert stats[0]["policy/loss"] == pytest.approx(whole_stats[0]["policy/loss"], rel=1e-5)
        for name in whole:
            torch.testing.assert_close(got[name], whole[name], rtol=1e-4, atol=1e-6)
    # two workers, each with some rows, weighted by the whole minibatch's counts; gradients summed
    first, second = experience.select(torch.arange(0, 3)), experience.select(torch.arange(3, 8))
    totals = {
        "total_tokens": experience.num_tokens,
        "total_rows": loss_unit_count(experience.response_mask, "rows"),
    }
    workers = make_trainer(base, run_dir=trainer.run_dir.parent / "workers").runtime.roles.policy
    got, _ = _step(workers, [first, second], **totals)
    for name in whole:
        torch.testing.assert_close(got[name], whole[name], rtol=1e-4, atol=1e-6)


def test_cov_control_selects_once_per_minibatch_and_runs(make_trainer):
    for method in ("clip_cov", "kl_cov"):
        band = (
            {"clip_cov_low": -10.0, "clip_cov_high": 10.0} if method == "clip_cov" else {}
        )  # Clip-Cov's own keys
        config = rl_config("grpo", SMALL, policy={"cov_control": method, "cov_ratio": 0.2, **band})
        trainer = make_trainer(config)
        experience = _experience(trainer)
        policy = trainer.runtime.roles.policy
        chosen = policy.with_cov_selection(experience).cov_mask
        assert chosen is not None and int(chosen.sum()) == int(0.2 * experience.num_tokens)
        assert float((chosen * (1 - experience.response_mask)).abs().sum()) == 0
        _, stats = _step(policy, [experience])
        assert stats[0]["policy/cov_fraction"] == pytest.approx(
            int(0.2 * experience.num_tokens) / experience.num_tokens
        )
