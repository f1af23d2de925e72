"""A reward model giving NaN or infinite scores stops the RL run before the scores are used."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.config import OptimConfig
from rlhf.rl.metrics import mean_over_steps
from rlhf.train.guards import (
    NONFINITE_GRADIENTS,
    NonFiniteScoresError,
    SkippedStepStreak,
    require_finite_scores,
    require_finite_tokens,
)
from rlhf.train.optimizer import build_optimizer, clip_and_step, step_metrics
from tests.support.train_testing import rl_config


def test_a_nan_reward_stops_the_run_naming_the_model_the_rows_and_the_fix(make_trainer):
    trainer = make_trainer(rl_config("ppo_max", model={"reward_model": "runs/broken-rm"}))
    moments_before = trainer.score_processor.state_dict()
    with torch.no_grad():
        trainer.runtime.roles.reward_model.model.head.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteScoresError) as caught:
        trainer.make_experience()
    message = str(caught.value)
    assert (
        "the reward model runs/broken-rm gave non-finite scores (nan/inf) to 8 of 8 responses at iteration 0:"
        in message
    )
    assert "row 0 " in message and "... (8 in all)" in message and "Fix: " in message
    assert trainer.score_processor.state_dict() == moments_before  # nothing of the batch was used


def test_finite_scores_pass_and_the_rows_shown_are_the_bad_ones():
    require_finite_scores(torch.tensor([0.5, -2.0]), model="m", what="rows", row=str, consequence="", fix="")
    with pytest.raises(NonFiniteScoresError, match=r"to 2 of 4 rows 1, 3\. none used\. Fix: retrain"):
        require_finite_scores(
            torch.tensor([0.0, float("inf"), 1.0, float("nan")]),
            model="m",
            what="rows",
            row=str,
            consequence="none used.",
            fix="retrain",
        )


# -- NaN/inf inside the RL update (found on an H200 in bf16: the critic went NaN and, unchecked, its
#    NaN values turned every policy weight into NaN in the first update) --------------------------


@pytest.mark.parametrize("pretraining", [False, True])
def test_a_nan_critic_value_stops_the_run_naming_the_critic_and_the_rows(make_trainer, pretraining):
    trainer = make_trainer(rl_config("ppo_max"))
    trainer.pretrain_done = not pretraining
    with torch.no_grad():
        trainer.runtime.roles.critic.model.head.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteScoresError) as caught:
        trainer.make_experience()
    message = str(caught.value)
    when = "critic pre-training iteration 0" if pretraining else "iteration 0"
    assert f"the critic gave non-finite values (nan/inf) to 8 of 8 responses at {when}: row 0 " in message
    assert "the last checkpoint is intact" in message and "--dtype float32" in message


def test_nan_log_probs_at_padding_pass_and_inside_a_response_stop():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    padded_nan = torch.tensor([[0.1, 0.2, float("nan")], [float("nan")] * 3, [0.3, float("inf"), 0.0]])
    require_finite_tokens(
        padded_nan, mask, model="m", quantity="log-probs", what="rows", row=str, consequence="", fix=""
    )
    inside = padded_nan.clone()
    inside[2, 0] = float("-inf")
    with pytest.raises(
        NonFiniteScoresError, match=r"m gave non-finite log-probs \(nan/inf\) to 1 of 3 rows 2\."
    ):
        require_finite_tokens(
            inside, mask, model="m", quantity="log-probs", what="rows", row=str, consequence="", fix="x"
        )
    one = torch.tensor([[float("nan")]])  # a batch of one
    with pytest.raises(NonFiniteScoresError, match="to 1 of 1 rows 0"):
        require_finite_tokens(
            one, torch.ones(1, 1), model="m", quantity="values", what="rows", row=str, consequence="", fix=""
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_step_with_non_finite_gradients_is_skipped_whole(bad):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    config = OptimConfig(lr=0.1, warmup_steps=0)
    optimizer, scheduler = build_optimizer(layer.parameters(), config, total_steps=10)
    before = [p.detach().clone() for p in layer.parameters()]
    layer(torch.ones(1, 3)).sum().backward()
    layer.bias.grad[0] = bad
    norm = clip_and_step(optimizer, scheduler, list(layer.parameters()), max_grad_norm=1.0)
    assert not math.isfinite(norm)
    assert all(torch.equal(b, p) for b, p in zip(before, layer.parameters(), strict=True))  # weights kept
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())  # no moment was made
    assert scheduler.last_epoch == 0 and all(p.grad is None for p in layer.parameters())
    layer(torch.ones(1, 3)).sum().backward()  # the next, finite step is taken
    assert math.isfinite(clip_and_step(optimizer, scheduler, list(layer.parameters()), max_grad_norm=1.0))
    assert scheduler.last_epoch == 1 and not torch.equal(before[0], layer.weight)


def test_step_metrics_leave_a_skipped_norm_out_of_the_mean():
    steps = [step_metrics("policy", 2.0), step_metrics("policy", float("nan")), step_metrics("policy", 4.0)]
    assert steps[1] == {"policy/skipped_step_fraction": 1.0}
    merged = mean_over_steps(steps)
    assert merged["policy/grad_norm"] == 3.0 and merged["policy/skipped_step_fraction"] == pytest.approx(
        1 / 3
    )


def test_three_updates_in_a_row_with_every_step_skipped_stop_the_run():
    streak = SkippedStepStreak(patience=3)
    for iteration, fraction in enumerate([1.0, 1.0, 0.5, 1.0, 1.0]):  # a partly skipped update resets
        streak.update("critic", fraction, iteration, fix="f")
    with pytest.raises(
        NonFiniteScoresError,
        match=r"the critic skipped every optimizer step .* 3 updates in a row \(to iteration 5\).*Fix: f",
    ):
        streak.update("critic", 1.0, 5, fix="f")


def test_a_policy_step_with_nan_gradients_is_skipped_warned_and_the_run_goes_on(make_trainer, tmp_path):
    trainer = make_trainer(rl_config("ppo_max", critic={"pretrain_iterations": 0}, train={"iterations": 1}))
    policy = trainer.runtime.roles.policy
    calls = {"n": 0}

    def first_backward_nan(grad):  # the first micro-batch's gradient of one weight is NaN
        calls["n"] += 1
        return torch.full_like(grad, float("nan")) if calls["n"] == 1 else grad

    weight = next(p for p in policy.model.parameters() if p.requires_grad)
    weight.register_hook(first_backward_nan)
    metrics = trainer.step()
    assert 0 < metrics["policy/skipped_step_fraction"] < 1  # one step of the update skipped, not all
    assert math.isfinite(metrics["policy/grad_norm"])
    assert all(bool(torch.isfinite(p).all()) for p in policy.model.parameters())
    trainer.logger.close()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    warned = [r for r in records if r.get("code") == NONFINITE_GRADIENTS]
    assert len(warned) == 1 and "the policy skipped" in warned[0]["message"]
