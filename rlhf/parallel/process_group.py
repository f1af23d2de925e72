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
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from rlhf.config import ConfigError, DistConfig
from rlhf.models.device import resolve_device
from rlhf.parallel.threads import oversubscription_note, thread_budget


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


def in_sharded_group(strategy: str) -> bool:
    """This process is one of several under `dist.strategy fsdp2`: a torchrun launch, or an actor of
    a Ray role group (rlhf/ray_runtime/worker.py starts that group itself, without torchrun's env)."""
    grouped = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return strategy == "fsdp2" and (launch_world_size() > 1 or grouped)


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
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" is this rank's GPU
    else:
        # this rank's share of the node's cores, an explicit OMP_NUM_THREADS when lower (threads.py)
        torch.set_num_threads(thread_budget())
        note = oversubscription_note()
        if note and launch_rank() == 0:
            print(f"note: {note}", file=sys.stderr)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout))
    try:
        yield True
        # every rank done before any tears its group down: a rank leaving while a peer's last
        # gloo transfer is in flight can abort that peer at exit ("terminate called ...")
        try:
            dist.barrier()
        except RuntimeError:  # the group broke earlier (a peer was lost): nothing left to wait for
            pass
    finally:
        dist.destroy_process_group()


class LostWorker(RuntimeError):
    """A process of the run (a Ray actor) died; the message names it and the checkpoint to resume from."""


T = TypeVar("T")


def agreed_on_rank0(check: Callable[[], T]) -> T | None:
    """`check()` on rank 0 alone (it may write the run directory), its verdict shared by every rank:
    when it raises, rank 0 re-raises the error and every other rank raises a `ConfigError` with the
    same message (a user mistake) or naming rank 0's failure, so that no rank waits at its next
    collective for a peer that stopped, or runs on alone. Returns `check()`'s result on rank 0 and
    None elsewhere; without a process group it is just `check()`."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return check()
    result, failure = None, None
    verdict: list[tuple[str, bool] | None] = [None]
    if dist.get_rank() == 0:
        try:
            result = check()
        except Exception as err:  # noqa: BLE001 (shared with the other ranks, then re-raised)
            failure = err
            verdict = [(str(err), _is_user_mistake(err))]
    dist.broadcast_object_list(verdict, src=0)
    if failure is not None:
        raise failure
    if verdict[0] is not None:
        message, user_error = verdict[0]
        if user_error:
            raise ConfigError(message)
        raise RuntimeError(f"rank 0 stopped ({message}); this rank stops with it")
    return result


def _is_user_mistake(err: Exception) -> bool:
    """The errors the command line reports as the user's (exit 2; rlhf/cli/errors.py is_user_error)."""
    from rlhf.data.errors import DataError
    from rlhf.models.loading import ModelLoadingError

    if isinstance(err, (ConfigError, DataError, ModelLoadingError)):
        return True
    return isinstance(err, ValueError) and "Fix:" in str(err)


def is_lost_peer(err: BaseException) -> bool:
    """A collective that failed because another rank died, stopped, or kept it waiting past
    dist.timeout (torch's DistError, or the backend's RuntimeError naming gloo or NCCL), or a
    worker process that died (LostWorker)."""
    if isinstance(err, (dist.DistError, LostWorker)):
        return True
    return isinstance(err, RuntimeError) and any(name in str(err) for name in ("gloo", "NCCL"))


def lost_peer_message(err: BaseException, run_dir: str | Path | None = None) -> str:
    if isinstance(err, LostWorker):
        return str(err)
    summary = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    resume = f"rlhf train --resume {run_dir}" if run_dir else "the same command"
    return (
        f"lost contact with the other ranks: one of them failed or was stopped, or a collective waited "
        f"longer than dist.timeout ({summary}). Fix: read the first failing rank's message (torchrun "
        f"names it under 'Root Cause'), then start again with torchrun and {resume}."
    )
