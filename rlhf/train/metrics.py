"""Metrics over sampled responses that need no model: diversity."""

from __future__ import annotations

import torch


def distinct_n(response_ids: torch.Tensor, response_mask: torch.Tensor, n: int = 2) -> float:
    """Distinct-n: unique n-grams / total n-grams over all responses' real tokens (0 when there are none)."""
    grams: list[tuple[int, ...]] = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        tokens = [t for t, m in zip(ids, mask) if m]
        grams.extend(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return len(set(grams)) / len(grams) if grams else 0.0
