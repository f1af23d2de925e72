"""Evaluation statistics against hand computations: win/tie/loss, Wilson intervals, mean with CI."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhf.evaluation.judging import compare_scores, decode_responses, mean_with_ci, wilson_interval
from rlhf.models.sampling import Rollout


def test_wilson_interval_of_one_in_four():
    low, high = wilson_interval(1, 4)
    assert low == pytest.approx(0.04559, abs=1e-5) and high == pytest.approx(0.69936, abs=1e-5)


@given(n=st.integers(1, 500), data=st.data())
def test_wilson_bounds_solve_the_score_equation(n, data):
    """The Wilson bounds are the proportions pi with (p - pi)^2 = z^2 pi (1 - pi) / n, inside [0, 1]."""
    successes = data.draw(st.integers(0, n))
    z, p = 1.96, successes / n
    low, high = wilson_interval(successes, n, z)
    assert 0.0 <= low <= p <= high <= 1.0
    for bound in (low, high):
        assert (p - bound) ** 2 == pytest.approx(z * z * bound * (1 - bound) / n, abs=1e-9)
    if successes == 0:
        assert low == 0.0
    if successes == n:
        assert high == 1.0


def test_wilson_without_data_is_the_whole_range():
    assert wilson_interval(0, 0) == [0.0, 1.0]


def test_compare_scores_by_hand():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    b = torch.tensor([1.0, 1.0, 5.0, 4.0 + 1e-8, -2.0])  # tie, win, loss, tie (within tolerance), win
    result = compare_scores(a, b)
    assert (result["n"], result["win"], result["tie"], result["loss"]) == (5, 0.4, 0.4, 0.2)
    assert result["win"] + result["tie"] + result["loss"] == pytest.approx(1.0)
    assert result["win_rate"] == pytest.approx((2 + 0.5 * 2) / 5)
    assert result["win_ci95"] == wilson_interval(2, 5)
    assert result["loss_ci95"] == wilson_interval(1, 5)
    assert result["win_rate_ci95"] == wilson_interval(3, 5)
    swapped = compare_scores(b, a)
    assert (swapped["win"], swapped["loss"]) == (result["loss"], result["win"])


def test_compare_scores_rejects_unpaired_scores():
    with pytest.raises(ValueError, match="paired scores differ in shape"):
        compare_scores(torch.zeros(3), torch.zeros(4))


def test_mean_with_ci_by_hand():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0])
    result = mean_with_ci(values)
    std = math.sqrt(sum((v - 3.0) ** 2 for v in (1, 2, 3, 6)) / 3)  # unbiased
    assert result["mean"] == 3.0 and result["n"] == 4
    assert result["std"] == pytest.approx(std)
    assert result["ci95"] == pytest.approx([3.0 - 1.96 * std / 2, 3.0 + 1.96 * std / 2])
    assert mean_with_ci(torch.tensor([5.0])) == {"mean": 5.0, "std": 0.0, "ci95": [5.0, 5.0], "n": 1}


def test_decode_responses_drops_eos_and_padding(tok):
    a, b, eos, pad = tok.convert_tokens_to_ids(["a", "b"]) + [tok.eos_token_id, tok.pad_token_id]
    response = torch.tensor([[a, b, eos], [b, eos, pad], [a, a, a]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    prompt = torch.tensor([[a], [a], [b]])
    rollout = Rollout(
        input_ids=torch.cat([prompt, response], 1),
        attention_mask=torch.cat([torch.ones(3, 1), mask], 1).long(),
        prompt_length=1,
        response_mask=mask,
        ended_with_eos=torch.tensor([True, True, False]),
    )
    assert decode_responses(tok, rollout) == ["a b", "b", "a a a"]
