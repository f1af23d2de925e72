"""Runtimes place the roles (rlhf/rl/roles/) and schedule their work; the RL loop is the same
for all of them.

    local        one process, CPU or one GPU (threads that overlap critic and policy live here)
    distributed  torchrun: every rank holds every role and a share of the rows; gradients summed
    ray          (later) role groups on Ray actors across machines

A runtime offers `map_rows(forward, sequences)` for a rollout's no-grad forwards and
`train(learners, minibatches)` for the optimizer steps of an update.
"""

from rlhf.runtime.distributed import DistributedRuntime, runtime_for
from rlhf.runtime.local import LocalRuntime

__all__ = ["DistributedRuntime", "LocalRuntime", "runtime_for"]
