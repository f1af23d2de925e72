"""ScoreProcessor edges: the first std-defined batch (two scores), the discounted variant's gamma,
and clipping bounds, each against numpy or a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhf.core import ScoreProcessor


def test_scaling_starts_with_exactly_two_scores() -> None:
    processor = ScoreProcessor(scale=True)
    out = processor(torch.tensor([1.0, 3.0], dtype=torch.float64))
    std = float(np.std([1.0, 3.0], ddof=1))  # sqrt(2)
    assert out.tolist() == pytest.approx([1.0 / std, 3.0 / std], rel=1e-15)


def test_normalization_starts_with_exactly_two_scores() -> None:
    out = ScoreProcessor(normalize=True)(torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert out.tolist() == pytest.approx([-(2**-0.5), 2**-0.5], rel=1e-15)


def test_second_single_score_batch_is_scaled_by_the_two_score_std() -> None:
    processor = ScoreProcessor(scale=True)
    assert processor(torch.tensor([2.0], dtype=torch.float64)).tolist() == [2.0]  # one score: unscaled
    out = processor(torch.tensor([6.0], dtype=torch.float64))
    assert out.tolist() == pytest.approx([6.0 / float(np.std([2.0, 6.0], ddof=1))], rel=1e-15)


def test_std_at_eps_is_unscaled_and_just_above_is_scaled() -> None:
    scores = torch.tensor([0.0, 0.5], dtype=torch.float64)  # std = 0.5 / sqrt(2)
    std = float(np.std([0.0, 0.5], ddof=1))
    assert ScoreProcessor(scale=True, eps=std)(scores).tolist() == [0.0, 0.5]
    scaled = ScoreProcessor(scale=True, eps=std * 0.999)(scores).tolist()
    assert scaled == pytest.approx([0.0, 0.5 / std], rel=1e-15)


def test_discounted_scaling_needs_a_gamma_below_one() -> None:
    with pytest.raises(ValueError, match="0 <= gamma < 1"):
        ScoreProcessor(scale=True, discounted=True)  # the default gamma 1.0 is a random walk
    with pytest.raises(ValueError, match="got gamma=1.0"):
        ScoreProcessor(scale=True, discounted=True)
    with pytest.raises(ValueError, match="gamma=-0.5"):
        ScoreProcessor(scale=True, discounted=True, gamma=-0.5)
    with pytest.raises(ValueError, match="set scale=True and normalize=False"):
        ScoreProcessor(discounted=True, gamma=0.9)
    with pytest.raises(ValueError, match="set scale=True and normalize=False"):
        ScoreProcessor(scale=True, normalize=True, discounted=True, gamma=0.9)
    ScoreProcessor(scale=True, discounted=True, gamma=0.0)  # gamma = 0 is allowed (plain scaling)
    ScoreProcessor(scale=False, discounted=False, gamma=5.0)  # gamma is only read when discounted


def test_discounted_returns_by_hand() -> None:
    processor = ScoreProcessor(scale=True, discounted=True, gamma=0.5)
    out = processor(torch.tensor([2.0, 4.0], dtype=torch.float64))
    returns = [2.0, 0.5 * 2.0 + 4.0]  # R <- gamma * R + r, in row order
    std = float(np.std(returns, ddof=1))
    assert processor.return_moments.mean == pytest.approx(3.5, rel=1e-15)
    assert out.tolist() == pytest.approx([2.0 / std, 4.0 / std], rel=1e-15)
    assert processor.state_dict()["discounted_return"] == 5.0


@pytest.mark.parametrize("clip", [0.5, 2.0])
def test_clip_is_symmetric_and_inclusive(clip: float) -> None:
    scores = torch.tensor([-3.0, -clip, 0.25, clip, 3.0], dtype=torch.float64)
    out = ScoreProcessor(clip=clip)(scores).tolist()
    assert out == [max(-clip, min(clip, s)) for s in scores.tolist()]
    with pytest.raises(ValueError, match="reward clip must be > 0"):
        ScoreProcessor(clip=0.0)


def test_wrong_shape_and_missing_state_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="shape \\[B\\], got \\(2, 1\\)"):
        ScoreProcessor()(torch.ones(2, 1))
    with pytest.raises(KeyError, match="discounted_return"):
        ScoreProcessor().load_state_dict({"moments": {}, "return_moments": {}})


def test_default_eps_leaves_nearly_constant_scores_unscaled() -> None:
    scores = torch.tensor([1.0, 1.0 + 1e-12], dtype=torch.float64)  # std ~7e-13, below eps = 1e-8
    assert ScoreProcessor(scale=True)(scores).tolist() == scores.tolist()
    assert ScoreProcessor(scale=True, eps=0.0)(scores)[0].item() > 1e11  # eps 0: divided by ~7e-13


def test_default_eps_scales_a_std_just_above_it() -> None:
    scores = torch.tensor([0.0, 2e-8], dtype=torch.float64)  # std = 2e-8 / sqrt(2) ~ 1.4e-8 > 1e-8
    out = ScoreProcessor(scale=True)(scores)
    assert out.tolist() == pytest.approx([0.0, 2**0.5], rel=1e-12)
