"""Mask checks shared by the core: a mask must be a tensor of the data's shape; nonzero = valid."""

from __future__ import annotations

import pytest
import torch

from rlhf.core import masked_mean, masked_sum


def test_a_list_mask_is_a_type_error_naming_its_type() -> None:
    with pytest.raises(TypeError, match="mask must be a torch.Tensor .* got list"):
        masked_mean(torch.ones(1, 2), [[1, 1]])


def test_any_nonzero_value_marks_a_valid_token() -> None:
    x = torch.tensor([[1.0, 2.0, 4.0, 8.0]])
    for mask in (torch.tensor([[2, 0, -1, 0]]), torch.tensor([[0.5, 0.0, 3.0, 0.0]]),
                 torch.tensor([[True, False, True, False]])):  # fmt: skip
        assert masked_sum(x, mask).item() == 5.0
        assert masked_mean(x, mask).item() == 2.5
