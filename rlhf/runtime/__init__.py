"""Runtimes place the roles (rlhf/rl/roles/) and schedule their work; the RL loop is the same for all.

    local        one process, CPU or one GPU (threads that overlap critic and policy live here)
    distributed  torchrun: every rank holds every role and a share of the rows; gradients summed
    ray          role groups on Ray actors across machines (rlhf/ray_runtime/, above rl)

The loop holds a `Runtime` (protocol.py; mypy checks every runtime against it) and calls its roles by
name on plain data: generate, submit_generate, forward, sample, train, use_ptx, save_checkpoint,
load_checkpoint, export, close, and the facts (docs/internals.md "rlhf.parallel, rlhf.runtime").
"""

from rlhf.runtime.distributed import DistributedRuntime, runtime_for
from rlhf.runtime.local import LocalRuntime

__all__ = ["DistributedRuntime", "LocalRuntime", "runtime_for"]
