"""bench/studies/mismatch.py measures one rollout's sampler/trainer gap on a tiny random Llama: the figures
it prints exist, and float32's gap is far below bfloat16's (the sampler and the trainer run the
same float32 math up to the order of its sums)."""

from __future__ import annotations

import math

from bench.studies.mismatch import measure


def test_float32_and_bfloat16_gaps_on_a_tiny_llama() -> None:
    f32 = measure(None, rows=16, max_new_tokens=32, seed=0, precision="float32")
    bf16 = measure(None, rows=16, max_new_tokens=32, seed=0, precision="bfloat16")
    for result in (f32, bf16):
        assert result["tokens"] > 0
        assert all(
            math.isfinite(result[k]) for k in ("mismatch/kl", "mismatch/max_ratio", "mismatch/mean_abs_diff")
        )
    assert f32["mismatch/mean_abs_diff"] < 1e-4 < bf16["mismatch/mean_abs_diff"]
