"""Run a function on 2 spawned ranks of a gloo process group, with a timeout (tests.support.ranks).

Each rank is a new process with torchrun's environment variables set, and joins the group through
`rlhf.parallel.process_group.data_parallel`, as `rlhf` under torchrun does (which gives each rank its
share of the cores: one thread each on 2 cores). The function must be importable by name (a
module-level function of a test helper module).

The ranks are forked from a server process (multiprocessing's forkserver, one per test process) that
has done nothing but import torch and the cases' modules: a spawned interpreter's state, without
paying those imports (seconds of CPU per rank) again for every job. They inherit the server's
environment, this process's when the first job started: set what a rank needs in `_rank_main`.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from multiprocessing import forkserver
from pathlib import Path

import torch
import torch.multiprocessing as mp

TIMEOUT = 240.0  # seconds for the whole spawned job (the tiny cases take a few seconds)
ROOT = Path(__file__).resolve().parents[2]
# what the forkserver imports once: torch, the rank's entry point, the cases and the stages they run
# (rlhf's trainer, models, runtimes, supervised stages); what fails to import there each rank imports
PRELOAD = [
    "torch", "tests.support.ranks", "tests.support.dist_cases", "rlhf.stages.train", "rlhf.stages.sft",
    "rlhf.stages.rm", "rlhf.stages.dpo", "rlhf.train.supervised", "rlhf.rundir.sharded_checkpoint",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out: str, collective_timeout: float, fn, args) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    os.environ.pop("OMP_NUM_THREADS", None)  # the user's choice, not the suite's, sets the ranks' threads
    from rlhf.config import DistConfig
    from rlhf.parallel.process_group import data_parallel
    from rlhf.parallel.threads import available_cores

    torch.set_num_threads(available_cores())  # a plain process's threads: the group divides them

    with data_parallel(DistConfig(strategy="ddp", timeout=collective_timeout), "cpu"):
        result = fn(*args)
    torch.save(result, Path(out) / f"rank{rank}.pt")


def _start_forkserver() -> None:
    """Start this process's forkserver (if not yet running) with `PRELOAD` imported; the repository
    root on its PYTHONPATH, as it is on this process's sys.path (the ranks get the whole sys.path)."""
    forkserver.set_forkserver_preload(PRELOAD)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([path] if path else [])])
    try:
        forkserver.ensure_running()
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path


def run_ranks(
    fn, *args, world_size: int = 2, timeout: float = TIMEOUT, collective_timeout: float = 60.0
) -> list:
    """`fn(*args)` on each of `world_size` ranks; their results in rank order. A rank that raises
    ends the others and re-raises here (torch's ProcessRaisedException, naming the rank); a job
    still running after `timeout` seconds is killed and raises TimeoutError."""
    _start_forkserver()
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, free_port(), out, collective_timeout, fn, args),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the {world_size} ranks did not finish within {timeout} s")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
