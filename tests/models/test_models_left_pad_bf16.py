"""A left-padded batch holds fully masked attention rows (a pad query sees no key): under bfloat16
autocast on the CPU, the critic's values and gradients stay finite, and the valid rows' values are
those of the rows alone, unpadded (the bf16 critic NaN of examples/smollm2_hh/README.md is not this
mechanism on a CPU; bench/studies/critic_nan_gpu.py asks a GPU)."""

from __future__ import annotations

import pytest
import torch

from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer


@pytest.mark.parametrize("autocast", [False, True])
def test_left_padded_rows_give_finite_values_and_gradients_equal_to_the_unpadded_rows(autocast):
    tok = word_tokenizer(["a b c d e f g h i j"])
    critic = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2), head_init_std=0.5
    )
    rows = [[5, 6, 7, 8, 9, 10], [7, 8], [9]]  # 0, 4 and 5 left pads
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        values = critic.values_from_hidden(critic.hidden_states(ids, mask))
    assert values.dtype == torch.float32
    loss = (values[mask.bool()] ** 2).mean()
    loss.backward()
    assert torch.isfinite(values).all()  # the pad positions too: nothing to mask away later
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in critic.parameters())
    for i, row in enumerate(rows):
        alone_ids, alone_mask = torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            alone = critic.values_from_hidden(critic.hidden_states(alone_ids, alone_mask))[0]
        tolerance = 0.05 if autocast else 1e-5  # bf16 rounds differently in a batch of other shapes
        torch.testing.assert_close(values[i, width - len(row) :].detach(), alone, atol=tolerance, rtol=0)
