"""whiten_advantages: the clip bound must be positive; the clip is symmetric and applied after
whitening (checked by hand on two tokens, whose whitened values are -+1/sqrt(2))."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import whiten_advantages


@pytest.mark.parametrize("clip", [0.0, -0.5])
def test_a_clip_bound_at_or_below_zero_is_rejected(clip: float) -> None:
    with pytest.raises(ValueError, match=f"advantage clip must be > 0 or None \\(off\\), got {clip}"):
        whiten_advantages(torch.ones(1, 2), torch.ones(1, 2), clip=clip)


def test_clip_after_whitening_by_hand() -> None:
    advantages = torch.tensor([[1.0, 5.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    half = 2**-0.5 * (8 / (8 + 1e-8)) ** 0.5  # (x - 3) / sqrt(8 + eps) with x - 3 = -+2
    assert whiten_advantages(advantages, mask)[0].tolist() == pytest.approx([-half, half, 0.0], rel=1e-12)
    assert whiten_advantages(advantages, mask, clip=0.5)[0].tolist() == [-0.5, 0.5, 0.0]
