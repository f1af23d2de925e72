"""RunningMoments' interface contracts: chaining returns the instance, a bad state is refused with
a message naming the problem, and repr shows the statistics."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import RunningMoments


def test_update_and_merge_return_the_instance() -> None:
    moments = RunningMoments()
    assert moments.update(torch.tensor([1.0, 3.0])) is moments
    assert moments.update(torch.empty(0)) is moments  # empty: a no-op that still chains
    assert moments.merge(RunningMoments().update(torch.tensor([5.0]))) is moments
    assert moments.merge(RunningMoments()) is moments
    assert (moments.count, moments.mean, moments.var) == (3, 3.0, 4.0)


@pytest.mark.parametrize(
    "state, error, message",
    [({"count": 1, "mean": 0.0}, KeyError, r"missing \['m2'\]; expected count, mean, m2"),
     ({"mean": 0.0}, KeyError, r"missing \['count', 'm2'\]"),
     ({"count": -1, "mean": 0.0, "m2": 0.0}, ValueError, "count and m2 must be >= 0"),
     ({"count": 2, "mean": 0.0, "m2": -0.5}, ValueError, "count and m2 must be >= 0")],
)  # fmt: skip
def test_bad_states_are_refused(state: dict, error: type, message: str) -> None:
    moments = RunningMoments().update(torch.tensor([1.0, 2.0]))
    with pytest.raises(error, match=message):
        moments.load_state_dict(state)
    assert moments.state_dict() == {"count": 2, "mean": 1.5, "m2": 0.5}  # unchanged


def test_repr_shows_count_mean_and_std() -> None:
    moments = RunningMoments().update(torch.tensor([1.0, 3.0]))
    assert repr(moments) == "RunningMoments(count=2, mean=2, std=1.41421)"
