"""apply_truncation_policy: responses that hit the length limit without EOS."""

from __future__ import annotations

import pytest
import torch

from rlhf.models.truncation import apply_truncation_policy

SCORES = torch.tensor([0.5, -2.0, 3.0, 1.0])
ENDED = torch.tensor([True, False, True, False])


def test_keep_changes_nothing():
    scores, keep = apply_truncation_policy(SCORES, ENDED, "keep")
    assert torch.equal(scores, SCORES) and keep.all()


def test_penalize_replaces_truncated_scores():
    scores, keep = apply_truncation_policy(SCORES, ENDED, "penalize", penalty=-5.0)
    assert scores.tolist() == [0.5, -5.0, 3.0, -5.0] and keep.all()
    assert SCORES.tolist() == [0.5, -2.0, 3.0, 1.0]  # input untouched


def test_drop_masks_truncated_samples():
    scores, keep = apply_truncation_policy(SCORES, ENDED, "drop")
    assert torch.equal(scores, SCORES) and keep.tolist() == [True, False, True, False]
    keep[0] = False
    assert ENDED[0]  # the mask is a copy


def test_errors():
    with pytest.raises(ValueError, match="'keep', 'penalize' or 'drop'"):
        apply_truncation_policy(SCORES, ENDED, "ignore")
    with pytest.raises(ValueError, match=r"\[B\]"):
        apply_truncation_policy(SCORES, ENDED[:2])
