"""One call of a supervised stage's model: `ModelCall(model)(fn, *args)` runs `fn(model, *args)` as
the wrapper's `forward`.

The stages call a causal LM as decoder + output head (rlhf/models/backbone.py), and the reward model
as trunk + scalar head + LM head, so that a head runs only on the columns a loss needs. Sharded per
layer (`dist.strategy fsdp2`, rlhf/parallel/fsdp.py), the root unit's parameters (embeddings, final
norm, heads) are gathered by its `forward` alone: every parameter a loss touches must go through one
call of the root. This wrapper is that root, as rlhf/rl/roles/forward.py's modules are the RL roles'.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.nn.parallel import DistributedDataParallel


class ModelCall(nn.Module):
    """`forward(fn, *args, **kwargs)` -> `fn(self.model, *args, **kwargs)`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def call_model(model: nn.Module, fn: Callable, *args, **kwargs):
    """`fn(model, ...)`, through `model`'s forward when it is a ModelCall (the inner model given to
    `fn`) or one under DistributedDataParallel (ddp: `SupervisedRun.call`), else directly: the stage
    functions take either."""
    if isinstance(model, (ModelCall, DistributedDataParallel)):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)
