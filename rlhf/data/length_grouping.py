"""Rows grouped by length, so that a micro-batch pads to about its rows' own length (docs/padding.md).

- within a step (`micro_batch_groups`): a step's rows sorted longest first, then cut into
  micro-batches; every loss is a sum over the step's tokens or pairs over its count
  (docs/algorithms.md#18-token-mean-accumulation-over-micro-batches), so the gradient is unchanged.
- across steps (`length_grouped_order`): the Hugging Face Trainer's `group_by_length`: mega-batches
  sorted by length and cut into steps, then shuffled; another data order, not the same gradients.
- by a token budget (`token_budget_groups`) or by packed tokens (`packed_groups`).
Longest first, so a length that does not fit in memory fails at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def longest_first(lengths: Sequence[int]) -> list[int]:
    """Positions 0..n-1 ordered by length, longest first; equal lengths keep their order."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def micro_batch_groups(lengths: Sequence[int], size: int, by_length: bool) -> list[list[int]]:
    """The positions 0..n-1 cut into micro-batches of `size`: in their order (the last one may be
    shorter), or with `by_length` in `longest_first` order, the shorter one placed where it saves
    the most (this grouping computes the fewest padded tokens of all). Every position appears
    exactly once. Rows that fit in one micro-batch keep their order (sorting saves nothing there)."""
    if size < 1:
        raise ValueError(f"micro-batch size must be at least 1, got {size}")
    if not (by_length and len(lengths) > size):
        return [list(range(start, min(start + size, len(lengths)))) for start in range(0, len(lengths), size)]
    order = longest_first(lengths)
    sizes = [size] * (len(order) // size)
    if len(order) % size:  # the shorter micro-batch goes where it saves the most padding
        short = len(order) % size
        sizes = min(
            (sizes[:k] + [short] + sizes[k:] for k in range(len(sizes) + 1)),
            key=lambda candidate: _padded_in_order([lengths[i] for i in order], candidate),
        )
    groups, start = [], 0
    for n in sizes:
        groups.append(order[start : start + n])
        start += n
    return groups


def token_budget_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """The positions 0..n-1 in `longest_first` order cut greedily into micro-batches whose padded
    cost, rows x longest row, stays within `budget` tokens (`train.micro_batch_tokens`): a
    micro-batch takes the next row while (rows + 1) x its first (longest) row's length fits. A row
    longer than the budget is a micro-batch of its own. Every position appears exactly once."""
    if budget < 1:
        raise ValueError(f"micro-batch token budget must be at least 1, got {budget}")
    groups: list[list[int]] = []
    for i in longest_first(lengths):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def packed_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """The positions 0..n-1 in `longest_first` order cut greedily into micro-batches for sequence
    packing (`train.packing`, rlhf/models/packing.py): a micro-batch takes the next row while its
    rows, placed first-fit in packed rows as wide as its first (longest) row, still fit `budget`
    tokens (packed rows x that width); a row longer than the budget is a micro-batch of its own.
    Every position appears exactly once."""
    if budget < 1:
        raise ValueError(f"micro-batch token budget must be at least 1, got {budget}")
    groups: list[list[int]] = []
    fills: list[int] = []  # the last micro-batch's packed rows: tokens in each
    for i in longest_first(lengths):
        if groups:
            width = max(lengths[groups[-1][0]], 1)
            free = next((b for b, used in enumerate(fills) if used + lengths[i] <= width), None)
            if free is not None:
                groups[-1].append(i)
                fills[free] += lengths[i]
                continue
            if (len(fills) + 1) * width <= budget:
                groups[-1].append(i)
                fills.append(lengths[i])
                continue
        groups.append([i])
        fills = [lengths[i]]
    return groups


def _padded_in_order(sorted_lengths: list[int], sizes: list[int]) -> int:
    """Computed tokens of consecutive groups of `sizes` over lengths sorted longest first."""
    total, start = 0, 0
    for n in sizes:
        total += n * sorted_lengths[start]  # a group's first row is its longest
        start += n
    return total


def length_grouped_order(
    order: Sequence[int],
    lengths: Sequence[int],
    batch_size: int,
    generator: torch.Generator,
    megabatch_steps: int = 50,
) -> list[int]:
    """`order` (row indices, already shuffled) regrouped so that each run of `batch_size` rows holds
    rows of similar length: mega-batches of `megabatch_steps * batch_size` consecutive rows, each
    sorted longest first, cut into steps, its full steps shuffled with `generator` (a last, shorter
    step stays last, so the runs of `batch_size` stay aligned). `lengths[i]` is the length of row i.
    The result is a permutation of `order`."""
    if batch_size < 1 or megabatch_steps < 1:
        raise ValueError(
            f"batch_size and megabatch_steps must be at least 1, got {batch_size}, {megabatch_steps}"
        )
    span = batch_size * megabatch_steps
    out: list[int] = []
    for start in range(0, len(order), span):
        mega = sorted(order[start : start + span], key=lambda i: -lengths[i])
        full = len(mega) // batch_size
        for s in torch.randperm(full, generator=generator).tolist():
            out += mega[s * batch_size : (s + 1) * batch_size]
        out += mega[full * batch_size :]
    return out


def padded_tokens(lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> int:
    """Tokens computed when each group is padded to its longest row: sum of rows x longest."""
    return sum(len(g) * max(lengths[i] for i in g) for g in groups if g)
