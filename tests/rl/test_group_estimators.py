"""Groups and critic-free runs (docs/algorithms.md §27-30): samples_per_prompt against prompts
duplicated by hand, minibatches of whole groups, no critic built/trained/saved for grpo and resume
of such a run, the KL term in the loss and Dr. GRPO's fixed-length loss aggregation."""

from __future__ import annotations

import pytest
import torch

from rlhf.config import ConfigError, RLConfig, load_config
from rlhf.core import kl_estimate, masked_mean
from rlhf.rl.experience import Experience, concat_experiences
from rlhf.rl.prompts import PromptStream
from rlhf.rundir import checkpoint as ckpt
from tests.rl.test_resume import Interrupted, interrupt_at
from tests.support.train_testing import metric_rows, perturb, rl_config

GRPO = {
    "advantage": {"estimator": "grpo", "whiten": False},
    "rollout": {"samples_per_prompt": 2, "batch_size": 4},
}


def _without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "throughput/", "group/"))}


def test_samples_per_prompt_with_gae_equals_prompts_duplicated_by_hand(make_trainer, prompts, tmp_path):
    grouped = make_trainer(
        rl_config("vanilla_ppo", rollout={"batch_size": 4, "samples_per_prompt": 2}), run_dir=tmp_path / "a"
    )
    by_hand = make_trainer(rl_config("vanilla_ppo", rollout={"batch_size": 8}), run_dir=tmp_path / "b")
    stream = PromptStream(prompts, seed=0)  # the grouped trainer's own stream, replayed
    by_hand.rollouts.prompts.next_batch = lambda size: [
        p for p in stream.next_batch(size // 2) for _ in range(2)
    ]
    for _ in range(2):  # two iterations: the second samples from the trained policies
        want, have = by_hand.step(), grouped.step()
        assert _without_timing(have) == _without_timing(want)
    assert "group/reward_std" in have and "group/reward_std" not in want
    for (name, a), (_, b) in zip(
        grouped.runtime.roles.policy.model.named_parameters(),
        by_hand.runtime.roles.policy.model.named_parameters(),
    ):
        assert torch.equal(a, b), name


def test_rollout_rows_of_a_prompt_are_adjacent_and_share_a_group(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", rollout={"batch_size": 3, "samples_per_prompt": 4}))
    experience, _ = trainer.make_experience()
    assert experience.group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    prompts = experience.input_ids[:, : experience.prompt_length]
    for g in range(3):
        assert (prompts[4 * g : 4 * g + 4] == prompts[4 * g]).all()


def _experience(groups: list[int]) -> Experience:
    b = len(groups)
    ids = torch.arange(b * 3).view(b, 3)
    ones = torch.ones(b, 2)
    return Experience(
        ids, torch.ones(b, 3, dtype=torch.long), 1, ones, ones, ones, ones, ones, ones, torch.tensor(groups)
    )


def test_group_minibatches_keep_each_group_whole_and_cover_every_row_once():
    experience = _experience([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    seen = []
    for minibatch in experience.minibatches(3, torch.Generator().manual_seed(0), whole_groups=True):
        rows = minibatch.input_ids[:, 0].div(3, rounding_mode="floor")
        seen += rows.tolist()
        for g in minibatch.group.unique().tolist():
            assert int((minibatch.group == g).sum()) == 3
    assert sorted(seen) == list(range(12))


def test_a_buffer_of_two_rollouts_keeps_their_groups_apart():
    joined = concat_experiences([_experience([0, 0, 1, 1]), _experience([0, 0, 1, 1])])
    assert joined.group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_grpo_run_builds_trains_and_saves_no_critic(make_trainer, tmp_path):
    config = rl_config("vanilla_ppo", GRPO, out=tmp_path / "run")
    trainer = make_trainer(config, run_dir=tmp_path / "run")
    assert trainer.runtime.roles.critic is None
    assert trainer.runtime.roles.learners() == [trainer.runtime.roles.policy]
    last = trainer.train()
    checkpoint = next((tmp_path / "run" / "checkpoints").iterdir())
    assert (checkpoint / "policy.trained.safetensors").exists()
    assert not list(checkpoint.glob("critic*"))
    roles = ckpt.load_state(checkpoint, "trainer")["roles"]
    assert set(roles) == {"policy"}  # no critic optimizer or schedule either
    assert not (tmp_path / "run" / "critic").exists()
    rows = metric_rows(tmp_path / "run", kinds=("iteration",))
    assert rows and all(not k.startswith("value/") for row in rows for k in row)
    assert {"group/reward_std", "group/zero_std_fraction", "policy/loss"} <= set(last)


def test_grpo_advantages_are_the_group_z_scores_of_the_processed_scores(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", GRPO))  # kl.beta 0: R is the processed score
    experience, _ = trainer.make_experience()
    mask = experience.response_mask
    per_row = [float(experience.advantages[b][mask[b] > 0][0]) for b in range(experience.batch_size)]
    with torch.no_grad():
        scores = trainer.runtime.roles.reward_model.model.score(
            experience.input_ids, experience.attention_mask
        )
    for g in range(4):
        pair = scores[2 * g : 2 * g + 2].double()
        z = (pair - pair.mean()) / (pair.std() + 1e-6)
        assert per_row[2 * g : 2 * g + 2] == pytest.approx(z.tolist(), rel=1e-4, abs=1e-5)


def critic_free_resumable(out):
    return rl_config(
        "vanilla_ppo",
        GRPO,
        out=out,
        train={"iterations": 4},
        checkpoint={"every": 2, "keep": 1},
        policy={"kl_loss_coef": 0.04},
        policy_optim={"schedule": "cosine", "warmup_steps": 2},
    )


def test_a_critic_free_run_resumes_to_identical_metrics(make_trainer, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    make_trainer(critic_free_resumable(whole), run_dir=whole).train()
    first = make_trainer(critic_free_resumable(split), run_dir=split)
    interrupt_at(first, 3)
    with pytest.raises(Interrupted):
        first.train()
    make_trainer(critic_free_resumable(split), run_dir=split, resume=True).train()
    expected, got = metric_rows(whole), metric_rows(split)
    assert [r["iteration"] for r in got] == [0, 1, 2, 3]
    assert got == expected
    assert all("policy/kl_loss" in r for r in got)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"model": {"critic_init": "policy"}},
            "command line: model.critic_init applies only when advantage.estimator uses a critic",
        ),
        (
            {"critic_optim": {"lr": 0.1}},
            "critic_optim.lr applies only when advantage.estimator uses a critic",
        ),
        (
            {"critic": {"value_clip": 0.5}},
            "critic.value_clip applies only when .* advantage.estimator is grpo",
        ),
    ],
)
def test_critic_settings_with_a_critic_free_estimator_are_rejected(overrides, message):
    layers = {"advantage": {"estimator": "grpo"}, "rollout": {"samples_per_prompt": 4}, **overrides}
    with pytest.raises(ConfigError, match=message):
        load_config(RLConfig, overrides=layers)


def test_critic_settings_in_a_file_name_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: {critic_mode: shared}\n")
    with pytest.raises(ConfigError, match=rf"{path}: model.critic_mode applies only when"):
        load_config(
            RLConfig,
            file=str(path),
            overrides={"advantage": {"estimator": "rloo"}, "rollout": {"samples_per_prompt": 2}},
        )


def test_a_group_estimator_needs_two_samples_per_prompt():
    with pytest.raises(
        ConfigError, match="rollout.samples_per_prompt is 1.*Fix: --rollout.samples_per_prompt 4"
    ):
        load_config(RLConfig, overrides={"advantage": {"estimator": "rloo"}})
    load_config(RLConfig, overrides={"advantage": {"estimator": "reinforce_pp"}})  # needs no group


def test_the_kl_loss_is_the_k3_mean_of_the_policy_against_the_reference(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", GRPO, policy={"kl_loss_coef": 0.5}))
    perturb(trainer.runtime.roles.policy.model, 0.05)  # a policy that differs from its reference
    experience, _ = trainer.make_experience()
    mask = experience.response_mask
    expected = float(masked_mean(kl_estimate(experience.old_logp, experience.ref_logp, "k3", mask), mask))
    assert expected > 1e-4
    stats = trainer.runtime.roles.policy.train_step(
        experience, experience.num_tokens
    )  # first step: logp = old_logp
    assert stats["policy/kl_loss"] == pytest.approx(expected, rel=1e-4)


def _policy_gradients(trainer, experience) -> dict[str, torch.Tensor]:
    policy = trainer.runtime.roles.policy
    policy.learner.optimizer_step = lambda: 0.0
    policy.train_step(experience, policy.loss_denominator(experience))
    return {n: q.grad.clone() for n, q in policy.learner.module.named_parameters() if q.grad is not None}


def test_fixed_length_aggregation_divides_the_token_sum_by_rows_times_max_new_tokens(make_trainer, tmp_path):
    config = rl_config("vanilla_ppo", train={"micro_batch_size": 3})
    token_mean = make_trainer(config, run_dir=tmp_path / "a")
    experience, _ = token_mean.make_experience()
    experience.advantages = torch.randn(
        experience.advantages.shape, generator=torch.Generator().manual_seed(0)
    )
    experience.advantages *= experience.response_mask
    fixed = make_trainer(
        rl_config("vanilla_ppo", train={"micro_batch_size": 3}, policy={"loss_aggregation": "fixed_length"}),
        run_dir=tmp_path / "b",
    )
    rows, max_new = experience.batch_size, config.rollout.max_new_tokens
    assert fixed.runtime.roles.policy.loss_denominator(experience) == rows * max_new
    tokens = experience.num_tokens
    assert tokens < rows * max_new  # some responses ended early: the two losses differ
    want = _policy_gradients(token_mean, experience)
    got = _policy_gradients(fixed, experience)
    for name in want:  # sum / (rows * L) = token mean * tokens / (rows * L)
        torch.testing.assert_close(got[name], want[name] * tokens / (rows * max_new), rtol=1e-4, atol=1e-7)


def test_fixed_length_aggregation_refuses_a_value_head_sharing_the_policys_step():
    overrides = {"policy": {"loss_aggregation": "fixed_length"}, "model": {"critic_mode": "shared"}}
    with pytest.raises(ConfigError, match="fixed_length with model.critic_mode shared"):
        load_config(RLConfig, overrides=overrides)
