"""Online DPO in the loop (docs/algorithms.md §45): ties and broken pairs dropped with their metrics,
the policy's step equal to DPO's loss on the sampled pairs (one forward of the whole minibatch,
float64 loop over the pairs) for any micro-batch split, the keys that cannot apply refused, and a
tiny run through the command line."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf.cli import main
from rlhf.config import ConfigError, RLConfig, load_config
from rlhf.rl.online_dpo import decisive_pairs
from tests.cli.test_cli import files  # noqa: F401 (the module's fixture of tiny files)
from tests.cli.test_cli_reward_fn import sft  # noqa: F401 (its SFT model)
from tests.support.train_testing import rl_config

SMALL = {
    "rollout": {"batch_size": 4},
    "train": {"minibatches": 1},
    "policy": {"dpo": {"beta": 0.5}},
}  # 8 rows


def test_ties_and_pairs_that_lost_a_row_are_dropped_and_counted():
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0, 0.0, 4.0, -1.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep = torch.tensor([True] * 5 + [False] + [True] * 2)  # group 2 lost a row (truncation policy)
    kept, metrics = decisive_pairs(scores, group, keep)
    assert kept.tolist() == [True, True, False, False, False, False, True, True]
    assert metrics == {"online_dpo/pairs": 2.0, "online_dpo/tie_fraction": 0.25, "online_dpo/score_gap": 3.5}
    kept, metrics = decisive_pairs(torch.tensor([0.5]), torch.tensor([0]), torch.tensor([True]))  # one row
    assert (
        kept.tolist() == [False] and metrics["online_dpo/pairs"] == 0 and metrics["online_dpo/score_gap"] == 0
    )


def _gradients(policy, experience) -> tuple[dict[str, torch.Tensor], dict]:
    policy.learner.optimizer_step = lambda: 0.0  # the gradients kept, no step
    stats = policy.train_step(experience)
    grads = policy.learner.module.named_parameters()
    return {n: q.grad.clone() for n, q in grads if q.grad is not None}, stats


def test_the_step_is_dpos_loss_on_the_sampled_pairs_for_any_micro_batch_split(make_trainer):
    base = rl_config("online_dpo", SMALL, train={"micro_batch_size": 8})
    trainer = make_trainer(base)
    experience, _ = trainer.make_experience()
    experience = experience.select(torch.arange(experience.batch_size))  # out of inference mode
    assert sorted(experience.advantages.sum(1).sign().tolist()) == [-1.0] * 4 + [1.0] * 4  # 4 ranked pairs
    experience.response_mask[5] = 0  # a fully masked row: its pair is broken, both rows train nothing
    sign = (experience.advantages * experience.response_mask).sum(1).sign()
    # the closed form: the policy's log-probs of the whole minibatch, DPO's loss over the pairs in float64
    closed = trainer.runtime.roles.policy  # sampled the rollout, not stepped: the initial weights
    logp, _ = closed.forward(experience.sequences, closed.sampling.temperature)
    mask = experience.response_mask
    sums = (logp.double() * mask).sum(1)
    ref = (experience.ref_logp.double() * mask).sum(1)
    loss, pairs = 0.0, []
    for g in experience.group.unique():
        rows = [i for i in range(experience.batch_size) if experience.group[i] == g and sign[i] != 0]
        if len(rows) == 2:
            c, r = sorted(rows, key=lambda i: -sign[i])
            pairs.append(c)
            h = (sums[c] - ref[c]) - (sums[r] - ref[r])
            loss = loss - torch.nn.functional.logsigmoid(0.5 * h)
    loss = loss / len(pairs)
    loss.backward()
    expected = {n: q.grad for n, q in closed.learner.module.named_parameters() if q.grad is not None}
    for size in (3, 1):  # an uneven split and one row per micro-batch
        config = rl_config("online_dpo", SMALL, train={"micro_batch_size": size})
        policy = make_trainer(config, run_dir=trainer.run_dir.parent / f"split{size}").runtime.roles.policy
        got, stats = _gradients(policy, experience)
        assert stats["policy/loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
        assert stats["online_dpo/pairs_per_step"] == 3
        assert got.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(got[name].double(), expected[name].double(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"advantage": {"estimator": "grpo"}}, "Fix: --advantage.estimator pairwise"),
        ({"kl": {"beta": 0.1}}, "Fix: --kl.beta 0"),
        ({"rollout": {"samples_per_prompt": 4}}, "Fix: --rollout.samples_per_prompt 2"),
        ({"policy": {"dpo": {"loss": "ipo", "label_smoothing": 0.1}}}, "policy.dpo.label_smoothing"),
        ({"policy": {"clip_eps": 0.1}}, "policy.clip_eps"),
        ({"policy": {"dpo": {"beta": 0.0}}}, "policy.dpo.beta"),
    ],
)
def test_keys_that_cannot_apply_to_online_dpo_are_refused(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        load_config(RLConfig, preset="online_dpo", overrides=overrides)


def test_dpo_keys_without_online_dpo_are_refused():
    with pytest.raises(ConfigError, match=r"policy\.dpo.*policy\.loss online_dpo"):
        load_config(RLConfig, preset="grpo", overrides={"policy": {"dpo": {"beta": 0.2}}})


@pytest.mark.slow
def test_online_dpo_from_the_command_line(sft, files, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = [
        "train",
        "--preset",
        "online_dpo",
        "--policy",
        sft,
        "--prompts",
        files["prompts"],
        "--out",
        str(out),
    ]
    tiny = ["--train.iterations", "2", "--rollout.batch_size", "3", "--rollout.max_new_tokens", "4",
            "--policy_optim.lr", "0.001", "--policy.dpo.loss", "robust", "--policy.dpo.label_smoothing", "0.1",
            "--log.sinks", "jsonl"]  # fmt: skip
    assert main([*args, "--reward-fn", "tests.support.reward_fns_testing:length", *tiny]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    iterations = [r for r in records if "iteration" in r and "event" not in r]
    assert len(iterations) == 2
    for r in iterations:
        assert 0 <= r["online_dpo/tie_fraction"] <= 1 and r["online_dpo/score_gap"] >= 0
        assert r["online_dpo/pairs"] + 3 * r["online_dpo/tie_fraction"] == 3  # every prompt a pair or a tie
        assert "kl/ref" in r and "value/loss" not in r
    assert (out / "model.safetensors").is_file() or any(out.glob("*.safetensors"))
    assert not (out / "critic").exists()
