"""Lockstep micro-batches for the supervised stages sharded per layer (docs/distributed.md).

Under `dist.strategy fsdp2` every forward and backward gathers one decoder layer at a time and
reduce-scatters its gradient: a collective per layer, so every rank must run as many forwards (and
backwards) as the others. A rank whose share of a step's rows (or of an evaluation's) makes fewer
micro-batches than the largest rank's runs fillers after its own: the first row of the whole batch
(every rank holds it), its loss weighted 0 and its results dropped, as the RL learners' zero-weight
fillers (rlhf/rl/roles/learner.py). The largest rank's share is ceil(rows / ranks)
(rlhf/runtime/peers.py `share_of`), cut in micro-batches of `size`.
"""

from __future__ import annotations

import math
from typing import Any

from rlhf.runtime.peers import Peers


def lockstep_count(rows: int, world_size: int, size: int) -> int:
    """The micro-batches of the largest rank's share of `rows` (ceil(ceil(rows / ranks) / size))."""
    largest = math.ceil(rows / world_size)
    return math.ceil(largest / size)


def with_fillers(groups: list[Any], rows: int, size: int, peers: Peers | None, per_layer: bool) -> list[Any]:
    """This rank's micro-batches `groups` (of its share of `rows`, `size` rows each), followed by
    None (a filler) up to the largest rank's count when the model is sharded per layer; else `groups`."""
    if peers is None or not per_layer:
        return list(groups)
    return list(groups) + [None] * (lockstep_count(rows, peers.world_size, size) - len(groups))
