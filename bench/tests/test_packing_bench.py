"""bench/speed/padding.py's packed table and bench/speed/packing.py's computed tokens: packing never computes more
tokens than the padded micro-batches of the same steps, and a pass's cost is its packed rows x width."""

from bench.speed.packing import computed_tokens
from bench.speed.padding import budget_table, packed_table
from rlhf.stages.sft import EncodedSFT

LENGTHS = [5, 1, 4, 2, 3, 7, 6, 8, 2, 2, 9, 1, 1, 3, 12, 4]
STEPS = [list(range(0, 8)), list(range(8, 16))]


def test_packing_pads_less_than_the_rows_and_the_budget():
    padded = budget_table(LENGTHS, sum(LENGTHS), 1, STEPS, 4, [16])
    packed = packed_table(LENGTHS, lambda i: [LENGTHS[i]], sum(LENGTHS), STEPS, 4, [16])
    assert packed["rows"]["padded"] < padded["rows"]["padded"]
    assert packed["16"]["padded"] <= padded["16"]["padded"]
    assert packed["16"]["largest_pass"] <= 16


def test_the_sft_bench_counts_packed_rows_times_width():
    rows = [EncodedSFT([1] * 2, [2] * n) for n in (10, 1, 2, 3)]  # 12, 3, 4, 5 positions
    # padded: one micro-batch of 4 rows, 11 columns computed (the last column never is)
    assert computed_tokens(rows, 4, packing=False) == 4 * 11
    # packed: 11 | 3 + 4 | 5 in rows of 11 -> 3 rows
    assert computed_tokens(rows, 4, packing=True) == 3 * 11
