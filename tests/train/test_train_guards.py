"""A reward model giving NaN or infinite scores stops the RL run before the scores are used."""

from __future__ import annotations

import pytest
import torch

from rlhf.train.guards import NonFiniteScoresError, require_finite_scores
from tests.support.train_testing import rl_config


def test_a_nan_reward_stops_the_run_naming_the_model_the_rows_and_the_fix(make_trainer):
    trainer = make_trainer(rl_config("ppo_max", model={"reward_model": "runs/broken-rm"}))
    moments_before = trainer.score_processor.state_dict()
    with torch.no_grad():
        trainer.roles.reward_model.model.head.bias.fill_(float("nan"))
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
