"""sampler_mismatch (rlhf/core/mismatch.py): against a plain loop over the tokens, the closed form
of a constant gap, and padding that is never read."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.mismatch import sampler_mismatch


def loop_mismatch(sampler, trainer, mask) -> dict[str, float]:
    """The three numbers, one token at a time in Python floats."""
    gaps = [
        float(t) - float(s)
        for s_row, t_row, m_row in zip(sampler.tolist(), trainer.tolist(), mask.tolist())
        for s, t, m in zip(s_row, t_row, m_row)
        if m
    ]
    if not gaps:
        return {"mismatch/kl": 0.0, "mismatch/max_ratio": 1.0, "mismatch/mean_abs_diff": 0.0}
    return {
        "mismatch/kl": sum(math.exp(r) - 1 - r for r in gaps) / len(gaps),
        "mismatch/max_ratio": math.exp(max(abs(r) for r in gaps)),
        "mismatch/mean_abs_diff": sum(abs(r) for r in gaps) / len(gaps),
    }


def test_equals_a_plain_loop_and_never_reads_padding():
    generator = torch.Generator().manual_seed(0)
    sampler = -torch.rand(4, 6, generator=generator) * 3
    trainer = sampler + 0.3 * torch.randn(4, 6, generator=generator)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    expected = loop_mismatch(sampler, trainer, mask)
    padded = mask == 0
    got = sampler_mismatch(sampler.masked_fill(padded, float("nan")), trainer.masked_fill(padded, 1e9), mask)
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("delta", [1e-3, 0.05, -0.2])
def test_a_constant_gap_gives_the_closed_form(delta):
    sampler = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.9, 0.3, 0.7]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    got = sampler_mismatch(sampler, sampler + delta, mask)
    assert got["mismatch/kl"] == pytest.approx(math.exp(delta) - 1 - delta, rel=1e-3)
    assert got["mismatch/max_ratio"] == pytest.approx(math.exp(abs(delta)), rel=1e-6)
    assert got["mismatch/mean_abs_diff"] == pytest.approx(abs(delta), rel=1e-4)


def test_equal_log_probs_and_no_valid_token():
    logp = -torch.rand(2, 3)
    assert sampler_mismatch(logp, logp.clone(), torch.ones(2, 3)) == {
        "mismatch/kl": 0.0, "mismatch/max_ratio": 1.0, "mismatch/mean_abs_diff": 0.0,
    }  # fmt: skip
    empty = sampler_mismatch(logp, logp + 5, torch.zeros(2, 3))
    assert empty == {"mismatch/kl": 0.0, "mismatch/max_ratio": 1.0, "mismatch/mean_abs_diff": 0.0}
