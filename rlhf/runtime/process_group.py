"""The process group of a torchrun launch: every rank joins it at start and leaves it at the end.

torchrun starts one process per rank and tells each who it is in environment variables (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). `data_parallel` reads them,
joins the default process group (gloo on the CPU, NCCL on CUDA) with a timeout on every collective,
so a rank that dies ends the others instead of leaving them waiting, and gives each rank its share
of the machine's cores. A plain `rlhf ...` (no torchrun) runs as one process with no group.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from rlhf.config import ConfigError, DistConfig
from rlhf.models.device import resolve_device
from rlhf.runtime.threads import available_cores


def launch_rank() -> int:
    """This process's rank in a torchrun launch (0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))


def launch_world_size() -> int:
    """Processes in the torchrun launch (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_writer_process() -> bool:
    """Rank 0 alone writes the run directory (metrics, console, checkpoints, reports, exports)."""
    return launch_rank() == 0


def sharded_launch(strategy: str) -> bool:
    """A launch of several processes under `dist.strategy fsdp2`: every role sharded per layer."""
    return strategy == "fsdp2" and launch_world_size() > 1


def rank_label() -> str:
    """ " (rank N of W)" in a multi-process launch, else "": for messages that must name their rank."""
    world = launch_world_size()
    return f" (rank {launch_rank()} of {world})" if world > 1 else ""


def backend_for(device: str) -> str:
    """NCCL for a CUDA device, gloo for the CPU (`device` as in train.device: auto, cpu, cuda, cuda:N)."""
    return "nccl" if resolve_device(device).type == "cuda" else "gloo"


@contextlib.contextmanager
def data_parallel(config: DistConfig, device: str = "auto") -> Iterator[bool]:
    """Join torchrun's process group for the body of the `with` (yields True), or run as one process
    (yields False) when there is no launch of several processes."""
    world = launch_world_size()
    if config.strategy == "none":
        if world > 1:
            raise ConfigError(
                f"torchrun started {world} processes but dist.strategy is none, so each would run the "
                "whole job alone. Fix: add --dist.strategy ddp (or start one process)."
            )
        yield False
        return
    if world == 1:
        yield False  # one process: the local runtime is the data-parallel run at world size 1
        return
    backend = backend_for(device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" is this rank's GPU
    else:
        torch.set_num_threads(max(1, available_cores() // local_world))  # the host's cores, shared
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout))
    try:
        yield True
    finally:
        dist.destroy_process_group()


class LostWorker(RuntimeError):
    """A process of the run (a Ray actor) died; the message names it and the checkpoint to resume from."""


def is_lost_peer(err: BaseException) -> bool:
    """A collective that failed because another rank died, stopped, or kept it waiting past
    dist.timeout (torch's DistError, or the backend's RuntimeError naming gloo or NCCL), or a
    worker process that died (LostWorker)."""
    if isinstance(err, (dist.DistError, LostWorker)):
        return True
    return isinstance(err, RuntimeError) and any(name in str(err) for name in ("gloo", "NCCL"))


def lost_peer_message(err: BaseException, run_dir=None) -> str:
    if isinstance(err, LostWorker):
        return str(err)
    summary = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    resume = f"rlhf train --resume {run_dir}" if run_dir else "the same command"
    return (
        f"lost contact with the other ranks: one of them failed or was stopped, or a collective waited "
        f"longer than dist.timeout ({summary}). Fix: read the first failing rank's message (torchrun "
        f"names it under 'Root Cause'), then start again with torchrun and {resume}."
    )
