"""The decoupled PPO importance weights (docs/algorithms.md §34) against hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core import decoupled_is_weights


def test_weights_are_the_truncated_probability_ratio_on_valid_tokens_and_zero_at_padding():
    prox = torch.tensor([[math.log(0.5), math.log(0.9), 7.0], [math.log(0.2), 0.0, 0.0]])
    behav = torch.tensor([[math.log(0.25), math.log(0.9), -3.0], [math.log(0.8), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    weights, stats = decoupled_is_weights(prox, behav, mask, truncation=1.5)
    # 0.5 / 0.25 = 2 -> truncated to 1.5; 0.9 / 0.9 = 1; 0.2 / 0.8 = 0.25; padding 0 (exp(10) ignored)
    assert torch.allclose(weights, torch.tensor([[1.5, 1.0, 0.0], [0.25, 0.0, 0.0]]))
    assert stats["async/is_weight_mean"] == pytest.approx((1.5 + 1.0 + 0.25) / 3)
    assert stats["async/is_weight_max"] == pytest.approx(1.5)
    assert stats["async/truncated_fraction"] == pytest.approx(1 / 3)


def test_the_same_policy_gives_weight_one_and_nan_at_padding_stays_out():
    logp = torch.log(torch.tensor([[0.3, 0.6]]))
    padded = torch.tensor([[0.0, float("nan")]])
    weights, stats = decoupled_is_weights(logp + padded * 0, logp.masked_fill(torch.tensor([[False, True]]), float("nan")),
                                          torch.tensor([[1, 0]]), truncation=2.0)  # fmt: skip
    assert weights.tolist() == [[1.0, 0.0]]
    assert stats == {"async/is_weight_mean": 1.0, "async/is_weight_max": 1.0, "async/truncated_fraction": 0.0}


def test_fully_masked_rows_and_a_batch_of_one():
    weights, stats = decoupled_is_weights(
        torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3), truncation=2.0
    )
    assert weights.tolist() == [[0.0, 0.0, 0.0]]
    assert stats == {"async/is_weight_mean": 0.0, "async/is_weight_max": 0.0, "async/truncated_fraction": 0.0}


def test_the_gradient_never_reaches_the_weights_inputs_through_padding():
    prox = torch.tensor([[0.0, 50.0]], requires_grad=True)
    weights, _ = decoupled_is_weights(prox, torch.zeros(1, 2), torch.tensor([[1, 0]]), truncation=10.0)
    weights.sum().backward()
    assert prox.grad.tolist() == [[1.0, 0.0]]  # d exp(x) / dx at 0; the padded token's is 0
