"""Masked statistics over response tokens and running moments of a stream.

Conventions (docs/algorithms.md#1-notation): a mean is ``sum over valid tokens / number of valid
tokens``, never a mean of per-row means; values at masked positions are never read (NaN included);
an empty selection gives 0, never NaN.

The mask helpers (`as_bool_mask`, `fill_masked`, `check_same_shape`) are shared by every core
function: inputs are *filled* (``torch.where``) with 0 at masked positions before any arithmetic,
since multiplying by the mask lets ``NaN * 0`` through, in the forward and in the backward."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor, like: Tensor, *, name: str = "x") -> Tensor:
    """Check that `mask` has the shape of `like` and return it as a bool tensor (nonzero = valid)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor (0/1 or bool), got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but {name} has shape {tuple(like.shape)}: "
            "pass a 0/1 mask of exactly the same shape (response tokens [B, T], right-padded)"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def fill_masked(x: Tensor, valid: Tensor, value: float = 0.0) -> Tensor:
    """`x` where `valid`, `value` elsewhere; gradients at the filled positions are exactly 0."""
    return torch.where(valid, x, torch.as_tensor(value, dtype=x.dtype, device=x.device))


def check_same_shape(reference: Tensor, name_ref: str, **tensors: Tensor | None) -> None:
    """Raise a ValueError naming the first tensor whose shape differs from `reference`."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {name_ref} has shape "
                f"{tuple(reference.shape)}: every per-token tensor must be [B, T] like the mask"
            )


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over valid positions (all of them, or along `dim`, e.g. per-sequence KL with dim=-1)."""
    valid = as_bool_mask(mask, x)
    filled = fill_masked(x, valid)
    return filled.sum() if dim is None else filled.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, normalizer: float | Tensor | None = None) -> Tensor:
    """Token mean of `x` over valid positions: a 0-d tensor; 0 when no position is valid.

    With `normalizer` the masked sum is divided by it instead of by this batch's token count:
    ``masked_mean(x, micro_mask, normalizer=minibatch_tokens)`` summed over micro-batches is the
    minibatch token mean (see ``rlhf.core.losses`` on gradient accumulation).
    """
    valid = as_bool_mask(mask, x)
    total = fill_masked(x, valid).sum()
    if normalizer is None:
        return total / valid.sum().clamp(min=1)
    if float(normalizer) <= 0:
        raise ValueError(f"normalizer must be a positive token count, got {float(normalizer)}")
    return total / normalizer


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over valid positions (n/(n-1) correction if `unbiased`); 0 when it is undefined.

    Undefined means n < 2 valid tokens for the unbiased variance, n = 0 for the biased one.
    """
    valid = as_bool_mask(mask, x)
    filled = fill_masked(x, valid)
    n = valid.sum()
    mean = filled.sum() / n.clamp(min=1)
    sum_sq = fill_masked(filled - mean, valid).square().sum()
    dof = n - 1 if unbiased else n
    return torch.where(dof > 0, sum_sq / dof.clamp(min=1), torch.zeros_like(sum_sq))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with masked mean and unbiased variance; 0 at masked positions.

    ``shift_mean=False`` adds the mean back (unit variance, original mean), as in trlX/TRL.
    A single valid token or a constant input whitens to 0 (its variance is taken as 0);
    a fully masked input gives zeros.
    """
    valid = as_bool_mask(mask, x)
    filled = fill_masked(x, valid)
    mean = masked_mean(filled, valid)
    var = masked_var(filled, valid, unbiased=True)
    whitened = (filled - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return fill_masked(whitened, valid)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest valid value of `x` (0-d); 0 when no position is valid. No host read: the masked
    positions are filled with the dtype's lowest value, not indexed out (a sync on a GPU)."""
    return _masked_extreme(x, mask, largest=True)


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Smallest valid value of `x` (0-d); 0 when no position is valid (no host read either)."""
    return _masked_extreme(x, mask, largest=False)


def _masked_extreme(x: Tensor, mask: Tensor, largest: bool) -> Tensor:
    valid = as_bool_mask(mask, x)
    if x.is_floating_point():
        fill: float = -math.inf if largest else math.inf
    else:
        info = torch.iinfo(x.dtype)
        fill = info.min if largest else info.max
    filled = x.masked_fill(~valid, fill)
    extreme = filled.amax() if largest else filled.amin()
    return torch.where(valid.any(), extreme, torch.zeros((), dtype=x.dtype, device=x.device))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var(G - V) / Var(G)`` over valid tokens (PPO paper §5.2 monitors); 0 if Var(G) = 0.

    1 is a perfect critic, 0 no better than a constant, negative worse than a constant.
    """
    check_same_shape(values, "values", returns=returns)
    valid = as_bool_mask(mask, values, name="values")
    v, g = fill_masked(values, valid), fill_masked(returns, valid)
    var_returns = masked_var(g, valid)
    var_residual = masked_var(g - v, valid)
    safe = torch.where(var_returns > 0, var_returns, torch.ones_like(var_returns))
    return torch.where(var_returns > 0, 1 - var_residual / safe, torch.zeros_like(var_returns))


class RunningMoments:
    """Mean and unbiased std of every value seen so far, exact at any point (PPO paper §5.3.1).

    Batches are combined with the parallel merge of Chan et al. (the pairwise form of Welford's
    algorithm), so two instances (e.g. two ranks) can be merged and the result equals the statistics
    of the concatenated data. Everything is held in float64 (Python floats). The state is three plain
    numbers: ``state_dict()`` is JSON-serializable and needs no pickle.
    """

    def __init__(self) -> None:
        self.count: int = 0
        self._mean: float = 0.0
        self._m2: float = 0.0  # sum of squared deviations from the mean

    @property
    def mean(self) -> float:
        """Mean of all values seen; 0 before any."""
        return self._mean

    @property
    def var(self) -> float:
        """Unbiased variance (n - 1 denominator); 0 with fewer than two values."""
        return self._m2 / (self.count - 1) if self.count >= 2 else 0.0

    @property
    def std(self) -> float:
        """Unbiased standard deviation; 0 with fewer than two values."""
        return math.sqrt(self.var)

    def update(self, x: Tensor) -> RunningMoments:
        """Add the values of the 1-D tensor `x` (an empty tensor is a no-op). Returns self."""
        x = torch.as_tensor(x)
        if x.dim() != 1:
            raise ValueError(
                f"RunningMoments.update expects a 1-D tensor of values, got shape {tuple(x.shape)}: "
                "select the valid entries first (e.g. x[mask.bool()]) so padding is not counted"
            )
        if x.numel() == 0:
            return self
        values = x.detach().to(torch.float64)
        if not bool(torch.isfinite(values).all()):
            raise ValueError(
                "RunningMoments.update got NaN or inf: refusing to poison the running statistics"
            )
        batch_mean = values.mean().item()
        batch_m2 = (values - batch_mean).square().sum().item()
        self._combine(values.numel(), batch_mean, batch_m2)
        return self

    def merge(self, other: RunningMoments) -> RunningMoments:
        """Fold the statistics of `other` into this instance (e.g. from another rank). Returns self."""
        self._combine(other.count, other._mean, other._m2)
        return self

    def _combine(self, count: int, mean: float, m2: float) -> None:
        if count == 0:
            return
        total = self.count + count
        delta = mean - self._mean
        self._mean += delta * count / total
        self._m2 += m2 + delta * delta * self.count * count / total
        self.count = total

    def state_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "mean": self._mean, "m2": self._m2}

    def load_state_dict(self, state: Mapping[str, float | int]) -> None:
        missing = {"count", "mean", "m2"} - set(state)
        if missing:
            raise KeyError(f"RunningMoments state is missing {sorted(missing)}; expected count, mean, m2")
        count = int(state["count"])
        if count < 0 or float(state["m2"]) < 0:
            raise ValueError(f"invalid RunningMoments state {dict(state)}: count and m2 must be >= 0")
        self.count, self._mean, self._m2 = count, float(state["mean"]), float(state["m2"])

    def __repr__(self) -> str:
        return f"RunningMoments(count={self.count}, mean={self.mean:.6g}, std={self.std:.6g})"
