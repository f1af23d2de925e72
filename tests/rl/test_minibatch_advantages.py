"""The trainer's per-minibatch advantage normalization and clipping (PPO paper §5.3.1,
docs/algorithms.md §11): whitened over the minibatch's valid tokens, then clipped symmetrically;
clipped raw when whitening is off; 0 at masked positions (checked by hand on two tokens, whose
whitened values are -+1/sqrt(2))."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import masked_whiten
from rlhf.rl.trainer import minibatch_advantages


def test_whiten_then_clip_by_hand() -> None:
    advantages = torch.tensor([[1.0, 5.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    half = 2**-0.5 * (8 / (8 + 1e-8)) ** 0.5  # (x - 3) / sqrt(8 + eps) with x - 3 = -+2
    whitened = minibatch_advantages(advantages, mask, whiten=True, clip=None)
    assert whitened[0].tolist() == pytest.approx([-half, half, 0.0], rel=1e-12)
    assert minibatch_advantages(advantages, mask, whiten=True, clip=0.5)[0].tolist() == [-0.5, 0.5, 0.0]


def test_off_leaves_the_advantages_and_clip_alone_clips_the_raw_ones() -> None:
    advantages = torch.tensor([[1.0, -5.0, 0.0], [0.25, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert minibatch_advantages(advantages, mask, whiten=False, clip=None) is advantages
    clipped = minibatch_advantages(advantages, mask, whiten=False, clip=0.5)
    assert clipped.tolist() == [[0.5, -0.5, 0.0], [0.25, 0.0, 0.0]]


def test_masked_rows_padding_and_a_fully_masked_minibatch() -> None:
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(4, 6, generator=gen) * 5
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 3, 1, 0])[:, None]).float()
    adv = adv * mask  # the estimators give 0 at masked positions
    whitened = masked_whiten(adv, mask)
    assert torch.equal(minibatch_advantages(adv, mask, whiten=True, clip=None), whitened)
    clipped = minibatch_advantages(adv, mask, whiten=True, clip=0.5)
    assert torch.equal(clipped, whitened.clamp(-0.5, 0.5))
    assert (whitened.abs() > 0.5).any()  # the clip did something
    assert torch.all(clipped[mask == 0] == 0)  # the fully masked last row too
    poisoned = torch.where(mask.bool(), adv, float("nan"))  # whatever padding holds is not read
    assert torch.equal(minibatch_advantages(poisoned, mask, whiten=True, clip=0.5), clipped)
    nothing = torch.zeros_like(mask)
    assert torch.equal(minibatch_advantages(adv, nothing, whiten=True, clip=0.5), torch.zeros_like(adv))


def test_a_batch_of_one_row() -> None:
    adv = torch.tensor([[2.0, 4.0, 6.0]], dtype=torch.float64)
    out = minibatch_advantages(adv, torch.ones_like(adv), whiten=True, clip=None)
    assert out[0].tolist() == pytest.approx([-1.0, 0.0, 1.0], rel=1e-7)  # (x - 4) / sqrt(4 + eps)
