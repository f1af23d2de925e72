"""How the RL roles train over data-parallel ranks: the strategy each learner is built with
(a learner gets its parallel strategy when it is built; no runtime patches it after).

Inside a process group (a torchrun launch, a Ray role group of several actors) every trained role
is replicated under DistributedDataParallel (`dist.strategy` ddp, or none: the torchrun runtime's
data parallelism is ddp's) or sharded per layer (fsdp2) at its runtime's first use, after a resumed
run has loaded the whole state (rlhf/runtime/distributed.py). Outside one there is no plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.config import DistConfig
from rlhf.parallel.peers import Peers, current_peers


@dataclass(frozen=True)
class ParallelPlan:
    peers: Peers
    strategy: str  # "ddp" | "fsdp2"; else ranks without a strategy (whose optimizer step is refused)
    bf16_compute: bool = False  # fsdp2: the layers gathered in bf16 (dtype bfloat16)
    offload: bool = False  # dist.offload: the shards and AdamW state in CPU memory
    sync_once: bool = False  # dist.grad_sync step: gradients reduced once per optimizer step


def parallel_plan(dist: DistConfig, bf16_compute: bool = False) -> ParallelPlan | None:
    """The plan of the roles built in this process: None outside a process group."""
    peers = current_peers()
    if peers is None:
        return None
    strategy = "fsdp2" if dist.strategy == "fsdp2" else "ddp"
    return ParallelPlan(peers, strategy, bf16_compute, dist.offload, dist.grad_sync == "step")
