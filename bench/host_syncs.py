"""Host-device syncs in one PPO update, counted on any device (issue 37): every op that reads a
tensor's value on the host (`float(t)`, `t.item()`, `bool(t)`, `nonzero`, `tolist`) stalls a GPU's queue of
launches until the device catches up. A TorchDispatchMode counts them on the CPU too, where they
cost nothing, so the count is measured without a GPU.

    python -m bench.host_syncs --workload small-4x4           # the policy's update (the calling thread)

The update of the second iteration is counted (the first warms up). With `runtime.overlap_critic`
the critic's steps run on another thread, which the mode (thread-local) does not see. A `tolist`
of a tensor that stays on the host in a GPU run is counted too (an over-count). Prints the
total, per optimizer step, and the busiest places (rlhf frames), then a JSON line.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import threading
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import emit, set_threads

READS = {
    "aten._local_scalar_dense.default",
    "aten.item.default",
    "aten.nonzero.default",
    "aten.equal.default",
    "aten.is_nonzero.default",
}


class HostReads(TorchDispatchMode):
    """Counts the ops that read a tensor's value on the host, by the rlhf frames that called them,
    and `Tensor.tolist` (on a CPU it dispatches no op; on a GPU it is one device-to-host copy, a sync)."""

    def __init__(self) -> None:
        super().__init__()
        self.places: collections.Counter = collections.Counter()
        self.original_tolist = torch.Tensor.tolist

    def record(self, op: str) -> None:
        frames = [f for f in traceback.extract_stack(limit=18)[:-3] if "/rlhf/" in f.filename]
        where = " <- ".join(
            f"{f.filename.split('/rlhf/')[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1]
        )
        self.places[(op, where)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in READS:
            self.record(str(func).split(".")[1])
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        original, reads = self.original_tolist, self

        thread = threading.get_ident()

        def tolist(tensor):
            if threading.get_ident() == thread:  # as the dispatch mode: the calling thread only
                reads.record("tolist")
            return original(tensor)

        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self.original_tolist  # type: ignore[method-assign]
        return super().__exit__(*exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="small-4x4")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    set_threads(2)
    from bench import ours
    from bench.gpu import workload_named

    workload = workload_named(args.workload)
    with tempfile.TemporaryDirectory(prefix="host_syncs_") as run_dir:
        trainer = ours.build_trainer(workload, 0, run_dir, {"train": {"device": "cpu"}})
        trainer.step()
        trainer.iteration += 1
        original, counted = trainer.update, []

        def update(*a, **k):
            with HostReads() as reads:
                out = original(*a, **k)
            counted.append(reads)
            return out

        trainer.update = update
        trainer.step()
        trainer.logger.close()
    places = counted[0].places
    total, steps = sum(places.values()), workload.ppo_epochs * workload.minibatches
    print(f"{total} host reads in the update, {total / steps:.1f} an optimizer step")
    for (op, where), n in places.most_common(args.top):
        print(f"{n:5d} {op:22s} {where}")
    emit({"workload": workload.name, "host_reads": total, "optimizer_steps": steps,
          "per_step": round(total / steps, 2)})  # fmt: skip


if __name__ == "__main__":
    main()
