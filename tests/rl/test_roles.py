"""The roles' interfaces: which roles step, the token-mean across split rows (the seam for data
parallelism), explained variance over the whole minibatch, each trained role's forward as one
nn.Module.forward (a DDP wrapper takes it), checkpoints of the layout before the roles."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import explained_variance
from rlhf.models.logprobs import response_logprobs
from rlhf.models.scalar_head import response_values
from rlhf.rl.experience import concat_experiences
from rlhf.rl.roles.critic import Critic, SharedCritic
from rlhf.rl.roles.policy import Policy
from tests.support.train_testing import rl_config


def test_learners_are_the_roles_that_step(make_trainer):
    separate = make_trainer(rl_config("ppo_max"))
    r = separate.runtime.roles
    assert isinstance(r.policy, Policy) and isinstance(r.critic, Critic)
    assert r.learners() == [r.policy, r.critic]
    assert r.learners(train_policy=False) == [r.critic]
    shared = make_trainer(rl_config("ppo_max", model={"critic_mode": "shared"})).runtime.roles
    assert isinstance(shared.critic, SharedCritic)
    assert shared.learners() == [shared.policy]  # the value loss is part of the policy's step
    assert shared.learners(train_policy=False) == [shared.critic]
    assert set(shared.learning_rates()) == {"policy/lr"}
    assert set(r.learning_rates()) == {"policy/lr", "value/lr"}


def _gradients_after(role, batches, total_tokens) -> dict[str, torch.Tensor]:
    """The gradients `role.train_step` leaves when its optimizer does not step (so they add up)."""
    role.learner.optimizer_step = lambda: 0.0
    for batch in batches:
        role.train_step(batch, total_tokens)
    return {n: q.grad.clone() for n, q in role.learner.module.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("role_name", ["policy", "critic"])
def test_rows_split_between_workers_give_the_whole_minibatch_gradient(make_trainer, role_name):
    """Two workers holding a part of the rows each, weighting by the whole minibatch's token count
    and summing their gradients, get the one-process gradient (uneven tokens per part)."""
    config = rl_config("ppo_max", train={"micro_batch_size": 2}, policy={"entropy_coef": 0.01})
    trainer = make_trainer(config)
    experience, _ = trainer.make_experience()
    experience.advantages = torch.randn(
        experience.advantages.shape, generator=torch.Generator().manual_seed(0)
    )
    experience.advantages *= experience.response_mask
    alone = getattr(trainer.runtime.roles, role_name)
    split = getattr(make_trainer(config, run_dir=trainer.run_dir.parent / "twin").runtime.roles, role_name)
    whole_tokens = experience.num_tokens
    first, second = experience.select(torch.arange(0, 3)), experience.select(torch.arange(3, 8))
    assert first.num_tokens != second.num_tokens
    expected = _gradients_after(alone, [experience], whole_tokens)
    got = _gradients_after(split, [first, second], whole_tokens)
    assert expected.keys() == got.keys() and expected
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_explained_variance_is_over_the_whole_minibatch(make_trainer):
    """Not an average over micro-batches: 1 - Var(G - V) / Var(G) over every valid token of the
    minibatch (here one minibatch of 8 rows in micro-batches of 2)."""
    config = rl_config("ppo_max", train={"micro_batch_size": 2, "minibatches": 1})
    trainer = make_trainer(config)
    experience, _ = trainer.make_experience()
    critic = trainer.runtime.roles.critic
    with torch.no_grad():
        values = response_values(
            critic.model, experience.input_ids, experience.attention_mask, experience.prompt_length
        )
    expected = float(explained_variance(values, experience.returns, experience.response_mask))
    stats = critic.train_step(experience, experience.num_tokens)
    assert stats["value/explained_variance"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    micro_means = []
    for micro in experience.micro_batches(2):
        with torch.no_grad():
            v = response_values(critic.model, micro.input_ids, micro.attention_mask, micro.prompt_length)
        micro_means.append(float(explained_variance(v, micro.returns, micro.response_mask)))
    assert stats["value/explained_variance"] != pytest.approx(sum(micro_means) / len(micro_means))


def test_each_trained_role_is_one_module_forward(make_trainer):
    trainer = make_trainer(rl_config("ppo_max"))
    experience, _ = trainer.make_experience()
    seqs = experience.sequences
    policy, critic = trainer.runtime.roles.policy, trainer.runtime.roles.critic
    assert isinstance(policy.forward, torch.nn.Module) and isinstance(critic.forward, torch.nn.Module)
    with torch.no_grad():
        logp = policy.forward(seqs, policy.sampling.temperature)[0]
        want = response_logprobs(policy.model, seqs.input_ids, seqs.attention_mask, seqs.prompt_length)[0]
        assert logp.equal(want)
        values = critic.forward(seqs)
        assert values.equal(
            response_values(critic.model, seqs.input_ids, seqs.attention_mask, seqs.prompt_length)
        )
    # every parameter the optimizer steps belongs to the module whose forward computes the loss
    module_params = {id(q) for q in policy.learner.module.parameters()}
    assert all(id(q) in module_params for q in policy.learner.trainable())


def test_a_ddp_wrapped_policy_forward_trains_like_the_plain_one(make_trainer, tmp_path):
    """DistributedDataParallel (gloo, one process) wraps the policy's forward module; a step through
    it changes the weights as a step through the plain module does."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    trainer = make_trainer(rl_config("ppo_max"))
    experience, _ = trainer.make_experience()
    experience.advantages = experience.response_mask.clone()
    plain = trainer.runtime.roles.policy
    wrapped = make_trainer(rl_config("ppo_max"), run_dir=tmp_path / "twin").runtime.roles.policy
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped.forward = DistributedDataParallel(wrapped.forward)
        plain.train_step(experience, experience.num_tokens)
        wrapped.train_step(experience, experience.num_tokens)
    finally:
        dist.destroy_process_group()
    for (name, a), (_, b) in zip(plain.model.named_parameters(), wrapped.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=name)


def test_update_stats_are_the_mean_of_the_steps(make_trainer):
    """Each step's stats are its minibatch's token means; an update reports their mean over steps
    (so each minibatch counts once, as its optimizer step does)."""
    trainer = make_trainer(rl_config("ppo_max", train={"minibatches": 2, "ppo_epochs": 2}))
    experience, _ = trainer.make_experience()
    seen = []
    original = trainer.runtime.train

    def spy(learners, minibatches):
        steps = original(learners, minibatches)
        seen.extend(steps)
        return steps

    trainer.runtime.train = spy
    stats = trainer.update(concat_experiences([experience]))
    policy_losses = [s["policy/loss"] for s in seen if "policy/loss" in s]
    assert len(policy_losses) == 4
    assert stats["policy/loss"] == pytest.approx(sum(policy_losses) / 4)
    assert stats["policy/ratio_max"] == max(s["policy/ratio_max"] for s in seen if "policy/ratio_max" in s)


def test_rollout_sampling_paper_reaches_the_sampler_and_the_reference(make_trainer):
    """`rollout.sampling: paper`: the policy samples with the PPO paper's §6.1 settings and the
    reference scores at the same temperature (the first PPO ratio stays 1)."""
    trainer = make_trainer(rl_config("ppo_max", rollout={"sampling": "paper"}))
    sampling = trainer.runtime.roles.policy.sampling
    assert (sampling.temperature, sampling.top_p, sampling.repetition_penalty) == (0.8, 0.9, 1.1)
    assert trainer.runtime.roles.reference.temperature == 0.8
    experience, _ = trainer.make_experience()
    assert float((experience.old_logp - experience.ref_logp).abs().max()) == 0.0
