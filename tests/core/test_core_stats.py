"""Masked statistics and RunningMoments against plain Python loops and numpy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core import (
    RunningMoments,
    explained_variance,
    masked_max,
    masked_mean,
    masked_min,
    masked_sum,
    masked_var,
    masked_whiten,
)

POISONS = [float("nan"), float("inf"), float("-inf"), 1e30]


def right_padded_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def valid_values(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return [v for row, mrow in zip(x.tolist(), mask.tolist()) for v, m in zip(row, mrow) if m]


def loop_mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def loop_var(values: list[float], unbiased: bool = True) -> float:
    n = len(values)
    if n < (2 if unbiased else 1):
        return 0.0
    mu = loop_mean(values)
    return sum((v - mu) ** 2 for v in values) / (n - 1 if unbiased else n)


def poison(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.full_like(x, value))


def random_case(seed: int, batch: int = 4, width: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, width, generator=gen, dtype=torch.float64) * 3 + 1
    lengths = torch.randint(0, width + 1, (batch,), generator=gen).tolist()
    lengths[0] = max(lengths[0], 2)  # at least two valid tokens overall
    return x, right_padded_mask(lengths, width).double()


def test_hand_made_token_mean_over_the_whole_batch() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 5.0, float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)  # 15 / 5, not the mean of row means 3.25
    assert masked_var(x, mask).item() == pytest.approx(2.5)  # 10 / 4
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2.0)
    assert masked_sum(x, mask).item() == pytest.approx(15.0)
    assert masked_sum(x, mask, dim=-1).tolist() == pytest.approx([6.0, 9.0])
    assert masked_max(x, mask).item() == 5.0 and masked_min(x, mask).item() == 1.0


@pytest.mark.parametrize("seed", range(8))
def test_random_cases_match_loops(seed: int) -> None:
    x, mask = random_case(seed)
    values = valid_values(x, mask)
    assert masked_mean(x, mask).item() == pytest.approx(loop_mean(values), rel=1e-12)
    assert masked_var(x, mask).item() == pytest.approx(loop_var(values), rel=1e-12)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(loop_var(values, False), rel=1e-12)
    rows = [sum(v for v, m in zip(r, mr) if m) for r, mr in zip(x.tolist(), mask.tolist())]
    assert masked_sum(x, mask, dim=-1).tolist() == pytest.approx(rows, rel=1e-12)
    assert masked_max(x, mask).item() == max(values) and masked_min(x, mask).item() == min(values)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_loop(seed: int, shift_mean: bool) -> None:
    x, mask = random_case(seed)
    values = valid_values(x, mask)
    mu, var = loop_mean(values), loop_var(values)
    out = masked_whiten(x, mask, shift_mean=shift_mean)
    for row_x, row_m, row_out in zip(x.tolist(), mask.tolist(), out.tolist()):
        for v, m, w in zip(row_x, row_m, row_out):
            expected = (v - mu) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else mu)
            assert w == pytest.approx(expected if m else 0.0, rel=1e-10, abs=1e-12)
    whitened = valid_values(out, mask)
    assert loop_mean(whitened) == pytest.approx(0.0 if shift_mean else mu, abs=1e-9)
    assert loop_var(whitened) == pytest.approx(1.0, rel=1e-6)


def test_fully_masked_gives_zeros_not_nan() -> None:
    x = torch.full((2, 3), float("nan"))
    mask = torch.zeros(2, 3)
    for value in (masked_mean(x, mask), masked_var(x, mask), masked_var(x, mask, unbiased=False)):
        assert value.item() == 0.0
    assert torch.equal(masked_whiten(x, mask), torch.zeros(2, 3))
    assert torch.equal(masked_sum(x, mask, dim=-1), torch.zeros(2))
    assert masked_max(x, mask).item() == 0.0 and masked_min(x, mask).item() == 0.0
    assert explained_variance(x, x, mask).item() == 0.0


def test_a_fully_masked_row_does_not_change_the_others() -> None:
    x, mask = random_case(0)
    x2 = torch.cat([x, torch.full((1, x.shape[1]), float("nan"), dtype=x.dtype)])
    mask2 = torch.cat([mask, torch.zeros(1, mask.shape[1], dtype=mask.dtype)])
    assert masked_mean(x2, mask2).item() == masked_mean(x, mask).item()
    assert torch.equal(masked_whiten(x2, mask2)[:-1], masked_whiten(x, mask))
    assert torch.equal(masked_whiten(x2, mask2)[-1], torch.zeros(x.shape[1], dtype=x.dtype))


def test_single_valid_token_and_batch_of_one() -> None:
    x = torch.tensor([[7.0, float("nan"), 3.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    assert masked_mean(x, mask).item() == 7.0
    assert masked_var(x, mask).item() == 0.0  # undefined with n = 1: 0
    assert masked_var(x, mask, unbiased=False).item() == 0.0
    assert torch.equal(masked_whiten(x, mask), torch.zeros(1, 3))
    assert masked_whiten(x, mask, shift_mean=False).tolist() == [[7.0, 0.0, 0.0]]
    one_row = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert masked_var(one_row, torch.ones(1, 4)).item() == pytest.approx(5 / 3)


@pytest.mark.parametrize("value", POISONS)
def test_mask_invariance_outputs_and_gradients(value: float) -> None:
    x, mask = random_case(3)
    poisoned = poison(x, mask, value).requires_grad_(True)
    clean = x.clone().requires_grad_(True)
    for fn in (
        lambda t: masked_mean(t, mask),
        lambda t: masked_var(t, mask),
        lambda t: masked_var(t, mask, unbiased=False),
        lambda t: masked_whiten(t, mask),
        lambda t: masked_whiten(t, mask, shift_mean=False),
        lambda t: masked_sum(t, mask, dim=-1),
        lambda t: masked_max(t, mask),
        lambda t: explained_variance(t, t.detach() * 0.5 + 1, mask),
    ):
        out_p, out_c = fn(poisoned), fn(clean)
        assert torch.equal(out_p, out_c)
        (grad_p,) = torch.autograd.grad(out_p.sum(), poisoned)
        (grad_c,) = torch.autograd.grad(out_c.sum(), clean)
        assert torch.equal(grad_p, grad_c)
        assert torch.all(grad_p[mask == 0] == 0)


def test_normalizer_divides_the_masked_sum() -> None:
    x, mask = random_case(5)
    total = sum(valid_values(x, mask))
    assert masked_mean(x, mask, normalizer=40).item() == pytest.approx(total / 40, rel=1e-12)
    assert masked_mean(x, mask, normalizer=torch.tensor(40.0)).item() == pytest.approx(total / 40, rel=1e-12)
    with pytest.raises(ValueError, match="normalizer"):
        masked_mean(x, mask, normalizer=0)


def test_mask_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\) but x has shape \(2, 4\)"):
        masked_mean(torch.zeros(2, 4), torch.ones(2, 3))


@pytest.mark.parametrize("seed", range(4))
def test_explained_variance_matches_loop(seed: int) -> None:
    x, mask = random_case(seed)
    returns = x
    values = x * 0.7 + torch.randn_like(x)
    g, v = valid_values(returns, mask), valid_values(values, mask)
    expected = 1 - loop_var([a - b for a, b in zip(g, v)]) / loop_var(g)
    assert explained_variance(values, returns, mask).item() == pytest.approx(expected, rel=1e-10)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(values, torch.ones_like(x), mask).item() == 0.0  # Var(G) = 0


# --- RunningMoments -------------------------------------------------------------------------

finite32 = st.floats(-1e4, 1e4, allow_nan=False, width=32)
batches = st.lists(st.lists(finite32, min_size=0, max_size=12), min_size=1, max_size=8)


def as_float32_list(batch: list[float]) -> list[float]:
    return torch.tensor(batch, dtype=torch.float32).double().tolist()


def assert_matches_numpy(moments: RunningMoments, data: list[float]) -> None:
    assert moments.count == len(data)
    if not data:
        return
    array = np.asarray(data, dtype=np.float64)
    scale = max(1.0, float(np.abs(array).max()))
    assert moments.mean == pytest.approx(float(array.mean()), rel=1e-9, abs=1e-12 * scale)
    if len(data) >= 2:
        assert moments.std == pytest.approx(float(array.std(ddof=1)), rel=1e-7, abs=1e-9 * scale)
    else:
        assert moments.std == 0.0


@settings(max_examples=60, deadline=None)
@given(batches=batches, owners=st.lists(st.integers(0, 2), min_size=8, max_size=8), data=st.data())
def test_running_moments_equal_numpy_through_updates_and_merges(
    batches: list[list[float]], owners: list[int], data: st.DataObject
) -> None:
    """Batches spread over three instances (ranks), merged in a random order, equal numpy."""
    ranks = [RunningMoments() for _ in range(3)]
    seen: list[list[float]] = [[], [], []]
    for batch, owner in zip(batches, owners):
        ranks[owner].update(torch.tensor(batch, dtype=torch.float32))
        seen[owner] += as_float32_list(batch)
        assert_matches_numpy(ranks[owner], seen[owner])
    order = data.draw(st.permutations([0, 1, 2]))
    merged = RunningMoments()
    all_values: list[float] = []
    for index in order:
        merged.merge(ranks[index])
        all_values += seen[index]
        assert_matches_numpy(merged, all_values)


def test_running_moments_single_stream_and_edge_cases() -> None:
    moments = RunningMoments()
    assert (moments.count, moments.mean, moments.std) == (0, 0.0, 0.0)
    moments.update(torch.tensor([]))
    assert moments.count == 0
    moments.update(torch.tensor([2.0]))
    assert (moments.count, moments.mean, moments.std) == (1, 2.0, 0.0)
    moments.update(torch.tensor([4.0, 6.0])).update(torch.tensor([], dtype=torch.float32))
    assert moments.count == 3 and moments.mean == 4.0 and moments.var == 4.0 and moments.std == 2.0
    before = moments.state_dict()
    moments.merge(RunningMoments())
    assert moments.state_dict() == before


def test_running_moments_float64_precision_with_large_offset() -> None:
    """A large mean with a small spread: float32 accumulation would lose the variance."""
    moments = RunningMoments()
    data = [1e6 + v for v in (0.25, 0.5, 0.75, 1.0)]
    for value in data:
        moments.update(torch.tensor([value], dtype=torch.float64))
    assert moments.std == pytest.approx(float(np.std(data, ddof=1)), rel=1e-9)


def test_running_moments_state_dict_is_plain_json_and_resumes() -> None:
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randn(5, generator=gen), torch.randn(7, generator=gen)
    full = RunningMoments().update(first).update(second)
    resumed = RunningMoments()
    resumed.load_state_dict(json.loads(json.dumps(RunningMoments().update(first).state_dict())))
    resumed.update(second)
    assert resumed.state_dict() == full.state_dict()
    with pytest.raises(KeyError, match="m2"):
        resumed.load_state_dict({"count": 1, "mean": 0.0})


def test_running_moments_rejects_bad_input() -> None:
    moments = RunningMoments()
    with pytest.raises(ValueError, match="1-D"):
        moments.update(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN or inf"):
        moments.update(torch.tensor([1.0, float("nan")]))
    assert moments.count == 0


def test_masked_extremes_read_nothing_on_the_host_and_take_integers():
    """No `x[valid]` (a nonzero, a host-device sync on a GPU): the masked positions are filled."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Reads.count += str(func) in ("aten._local_scalar_dense.default", "aten.nonzero.default")
            return func(*args, **(kwargs or {}))

    x = torch.tensor([[3.0, -1.0, 7.0], [2.0, 9.0, -4.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    with Reads():
        high, low = masked_max(x, mask), masked_min(x, mask)
        none = masked_max(x, torch.zeros_like(mask))
    assert Reads.count == 0
    assert (high.item(), low.item(), none.item()) == (3.0, -4.0, 0.0)
    ints = torch.tensor([5, -2, 8])
    assert masked_max(ints, torch.tensor([1, 1, 0])).item() == 5
    assert masked_min(ints, torch.tensor([0, 0, 1])).item() == 8
