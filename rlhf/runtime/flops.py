"""FLOP estimates that decide how the local runtime schedules work (never what is computed).

The side-by-side schedules of threads.py pay off only for products large enough to keep a core
busy: these counts of matmul FLOPs per token say when (thresholds measured with `make bench`, docs/speed.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

# Below this many FLOPs per half of the rows, splitting a rollout's forwards over two threads gains
# nothing (measured with `make bench`).
MIN_SPLIT_FORWARD_FLOPS = 1e9


def forward_flops(modules: Sequence[nn.Module], tokens: float) -> float:
    """FLOPs of a no-grad forward of `tokens` tokens through `modules`: 2 per matmul weight per token."""
    return 2.0 * tokens * sum(q.numel() for module in modules for q in matmul_weights(module))


# Below this many FLOPs per optimizer step, more intra-op threads slow a step down: its time is per-op
# overhead, not arithmetic (tiny-4x4 steps of ~0.2 GFLOP ran 2-3x slower on two threads than on one,
# small-4x4 steps of ~5.5 GFLOP 1.44x faster: `make bench`).
MIN_HANDOVER_STEP_FLOPS = 1e9


def handover_step(steps_here: int, flops_here: float, steps_beside: int, flops_beside: float) -> int:
    """How many of its steps the longer side (`steps_here` steps of `flops_here` FLOPs each) runs
    beside the shorter one: the step at which the shorter side (`steps_beside` steps of
    `flops_beside`) is predicted done, ceil(steps_beside * flops_beside / flops_here), at most
    `steps_here`. No hand-over (`steps_here`) for steps too small to gain from more threads."""
    if flops_here < MIN_HANDOVER_STEP_FLOPS:
        return steps_here
    return min(steps_here, math.ceil(steps_beside * flops_beside / flops_here - 1e-9))


def training_flops_per_token(modules: Sequence[nn.Module], scale: Sequence[float] | None = None) -> float:
    """FLOPs of one trained token through `modules` (a forward and its backward): every weight
    matrix costs 2 FLOPs per element for the forward, 2 for the input gradient and 2 more for its
    own gradient when it is trained; embedding tables are lookups (free), vectors negligible.
    `scale[i]` weighs module i (e.g. the share of tokens an output head sees)."""
    total = 0.0
    for i, module in enumerate(modules):
        flops = sum(q.numel() * (6 if q.requires_grad else 4) for q in matmul_weights(module))
        total += flops * (scale[i] if scale is not None else 1.0)
    return float(total)


def matmul_weights(module: nn.Module) -> list[torch.Tensor]:
    """The weights of `module` that enter matrix products: matrices but embedding tables (lookups)."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return [q for q in module.parameters() if q.dim() >= 2 and id(q) not in embeddings]
