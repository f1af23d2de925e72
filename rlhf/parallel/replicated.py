"""`dist.strategy ddp`: a learner's module replicated on every rank, its gradients summed over the
ranks by torch's `DistributedDataParallel` (docs/distributed.md), and the passes of an optimizer step
that reduce them (`fsdp_without_sync`: fsdp2's `dist.grad_sync step`; the learner's `Accumulation`,
rlhf/train/learner.py, runs them).

DDP all-reduces gradients in buckets during the backward of a step's last pass only (the others run
under `no_sync`), so every rank must run the same number of passes: the learner's engine pads a rank
whose rows run out with passes that weigh nothing, as under fsdp2. `replicate` gives the choices.
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
    to every rank), gradients summed. `module`'s forward must reach every parameter a loss uses in
    one call (rlhf/rl/roles/forward.py, rlhf/train/supervised/model_call.py).

    - `find_unused_parameters` unless `uses_every_parameter`: a pass may leave trained parameters out
      (a critic's LM head; a shared critic's value head or LM head; a reward model without its LM
      term). DDP then reduces the local gradient of a parameter the pass left out and leaves one no
      rank used without a gradient, so AdamW skips it as in one process. (Wrapping only the trained
      submodule would miss the shared critic; `static_graph` needs the same parameters every pass.)
    - a comm hook that sums (DDP divides by the world size): each pass's loss is already weighted by
      its tokens over the whole minibatch's, so the sum is the one-process gradient.
    - `gradient_as_bucket_view`, gradients zeroed in place after each step: each gradient is a view
      of DDP's bucket instead of a second copy. A parameter no rank used keeps None.
    - no buffer broadcast per forward: the buffers (rotary frequencies) never change, and it would
      put a collective in the no-grad forwards, which ranks run on uneven rows."""
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
