"""Masked statistics at their edges (few valid tokens, shape errors): outputs by definition or by
hand, gradients finite and exact.

With exactly one valid token the unbiased variance is undefined (0 by convention) and the whitened
value is 0 whatever the input: both are constants, so their gradients are exactly 0, never NaN.
"""

from __future__ import annotations

import pytest
import torch

from rlhf.core import explained_variance, masked_mean, masked_var, masked_whiten


def one_valid_token() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[2.5, -1.0, 4.0], [0.5, 3.0, 7.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    return x, mask


@pytest.mark.parametrize("unbiased", [True, False])
def test_variance_of_one_token_is_zero_with_zero_gradient(unbiased: bool) -> None:
    x, mask = one_valid_token()
    var = masked_var(x, mask, unbiased=unbiased)
    (grad,) = torch.autograd.grad(var, x)
    assert var.item() == 0.0  # unbiased: undefined -> 0; biased: (x - x)^2 / 1 = 0
    assert torch.equal(grad, torch.zeros_like(x))


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whitening_one_token_has_finite_closed_form_gradient(shift_mean: bool) -> None:
    x, mask = one_valid_token()
    whitened = masked_whiten(x, mask, shift_mean=shift_mean)
    weights = torch.arange(1.0, 7.0, dtype=torch.float64).reshape(2, 3)
    (grad,) = torch.autograd.grad((whitened * weights).sum(), x)
    # shift_mean: 0 everywhere (a constant). Otherwise the mean is added back: output = x at the
    # valid token, so d/dx = its weight there and 0 elsewhere.
    expected_out = torch.zeros_like(x) if shift_mean else (x * mask).detach()
    expected_grad = torch.zeros_like(x) if shift_mean else weights * mask
    assert torch.equal(whitened.detach(), expected_out)
    assert torch.equal(grad, expected_grad)


def test_fully_masked_gradients_are_zero() -> None:
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.float64)
    for fn in (masked_mean, masked_var, masked_whiten):
        (grad,) = torch.autograd.grad(fn(x, mask).sum(), x)
        assert torch.equal(grad, torch.zeros_like(x)), fn.__name__


def test_two_tokens_unbiased_variance_and_whitening_by_hand() -> None:
    x = torch.tensor([[1.0, 5.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    assert masked_var(x, mask).item() == 8.0  # ((1-3)^2 + (5-3)^2) / (2 - 1)
    assert masked_var(x, mask, unbiased=False).item() == 4.0
    expected = [-2 / (8 + 1e-8) ** 0.5, 2 / (8 + 1e-8) ** 0.5, 0.0]
    assert masked_whiten(x, mask)[0].tolist() == pytest.approx(expected, rel=1e-12)
    assert masked_whiten(x, mask, eps=1.0)[0].tolist() == pytest.approx([-2 / 3, 2 / 3, 0.0], rel=1e-12)


def test_explained_variance_edges_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    assert explained_variance(returns, returns, mask).item() == 1.0  # perfect critic
    values = torch.tensor([[0.0, 2.0, 4.0, -7.0]])  # residual (1, 0, -1): var 1 over var(G) = 1
    assert explained_variance(values, returns, mask).item() == 0.0
    worse = torch.tensor([[3.0, 2.0, 1.0, 0.0]])  # residual (-2, 0, 2): var 4 -> 1 - 4
    assert explained_variance(worse, returns, mask).item() == -3.0
    constant = torch.full((1, 4), 2.0)
    assert explained_variance(values, constant, mask).item() == 0.0  # Var(G) = 0: defined as 0


def test_explained_variance_shape_error_names_returns() -> None:
    with pytest.raises(ValueError, match="returns has shape \\(1, 3\\) but values has shape \\(1, 4\\)"):
        explained_variance(torch.ones(1, 4), torch.ones(1, 3), torch.ones(1, 4))


def test_explained_variance_of_constant_returns_has_zero_gradient() -> None:
    values = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    returns = torch.full((1, 3), 4.0, dtype=torch.float64)  # Var(G) = 0: defined as 0, a constant
    ev = explained_variance(values, returns, torch.ones(1, 3))
    (grad,) = torch.autograd.grad(ev, values)
    assert ev.item() == 0.0 and torch.equal(grad, torch.zeros_like(values))


def test_a_normalizer_of_one_token_is_allowed() -> None:
    x, mask = torch.tensor([[2.0, 5.0]]), torch.tensor([[1.0, 0.0]])
    assert masked_mean(x, mask, normalizer=1).item() == 2.0
    for bad in (0, -2.0):
        with pytest.raises(ValueError, match="normalizer must be a positive token count"):
            masked_mean(x, mask, normalizer=bad)
