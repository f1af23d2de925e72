"""`dist.strategy ddp`: a learner's module replicated on every rank, its gradients summed over the
ranks by torch's `DistributedDataParallel` (docs/distributed.md), and the passes of an optimizer step
that reduce them (`fsdp_without_sync`: fsdp2's `dist.grad_sync step`; the learner's `Accumulation`,
rlhf/train/learner.py, runs them).

DDP registers a hook on every parameter and all-reduces its gradients in buckets while the backward
still runs (the reduction overlaps the computation). It reduces only in the backward of a forward
that went through the wrapper, and only in the last forward/backward pass of an optimizer step: the
others run under `no_sync`, their gradients accumulated locally. DDP then needs every rank to run
the same number of passes: the runtime pads a rank whose rows run out with passes that weigh
nothing (the learner's engine, rlhf/train/learner.py), as under fsdp2.

Choices (issue 26):
- `find_unused_parameters=True` where a pass may leave trained parameters out (a critic's LM output
  head is never used; a shared critic's pre-training uses the value head, not the LM head; the last
  pass of a policy step with a shared critic is the value loss's; a reward model without its LM
  term). DDP then walks the pass's graph, reduces the local gradient of a parameter the pass left
  out (accumulated in an earlier pass, or none: zeros), and leaves a parameter no rank used without
  a gradient, so AdamW skips it as in one process. Wrapping only the trained submodule would not
  cover the shared-critic case, and `static_graph` needs the same parameters in every synchronized
  pass. A module whose every pass uses every trained parameter (a policy without a value head, the
  SFT and DPO models) skips that walk (and DDP's warning that it found nothing).
- A comm hook that sums (DDP divides by the world size by default): each pass's loss is already
  weighted by its tokens over the whole minibatch's (rlhf/train/learner.py), so the sum of the
  ranks' gradients is the one-process gradient.
- `gradient_as_bucket_view=True`, the gradients zeroed in place after each step (not dropped): each
  gradient is a view of DDP's bucket (which DDP keeps for the whole run), accumulated there by every
  pass, instead of a second copy beside it until the step (the whole trained model's gradients
  once more). A parameter no rank used is still left without a gradient
  (None), as is one whose gradients a role dropped (a shared critic's pre-training keeps the value
  head's only; a step without a valid token, `drop_weightless_gradients`). Only a parameter used in
  an earlier step and by no rank in this one would be stepped with a zero gradient where one
  process skips it; every role uses the same parameters in each of its steps.
- `forward_sync_buffers=False`: the buffers (rotary frequencies) never change, and a broadcast in
  every forward would put a collective in the no-grad forwards, which ranks run on uneven rows.
"""

# no `from __future__ import annotations`: DDP checks a comm hook's annotations (`sum_hook`) against
# its own classes, which strings would fail
import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which torch's stubs leave out
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from rlhf.parallel.peers import Peers


def replicate(module: nn.Module, peers: Peers, uses_every_parameter: bool = False) -> DistributedDataParallel:
    """`module` under DistributedDataParallel over `peers` (rank 0's parameters and buffers broadcast
    to every rank), gradients summed (module docstring). `module`'s forward must reach every
    parameter a loss uses in one call (rlhf/rl/roles/forward.py, rlhf/train/supervised/model_call.py).
    `uses_every_parameter`: every pass reaches every trained parameter (no unused-parameter walk)."""
    on_gpu = peers.device.type == "cuda"
    ddp = DistributedDataParallel(
        module,
        device_ids=[peers.device.index] if on_gpu else None,
        process_group=peers.group,
        find_unused_parameters=not uses_every_parameter,
        gradient_as_bucket_view=True,
        **no_buffer_sync_per_forward(),
    )
    ddp.register_comm_hook(peers.group, sum_hook)
    return ddp


def no_buffer_sync_per_forward() -> dict[str, Any]:
    """DDP's keyword that stops it broadcasting buffers before every forward (ours are the same on
    every rank: rotary frequencies): `forward_sync_buffers` from torch 2.13, `broadcast_buffers` before
    (the GPU image's torch 2.11 has no `forward_sync_buffers`; 2.13 deprecates `broadcast_buffers`)."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def sum_hook(group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A bucket's (dist.GradBucket) gradients summed over the ranks, as a future (DDP's default hook
    divides the sum by their number)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    summed: torch.futures.Future[torch.Tensor] = work.get_future().then(lambda done: done.value()[0])
    return summed


@contextlib.contextmanager
def fsdp_without_sync(root: nn.Module) -> Iterator[None]:
    """FSDP2's gradient reduction off for the body (the gradients accumulate unsharded), on after."""
    unit = cast(FSDPModule, root)  # sharded by fully_shard, which makes it an FSDPModule
    unit.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        unit.set_requires_gradient_sync(True)
