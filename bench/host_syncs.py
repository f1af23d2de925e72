"""Host-device syncs in one PPO update, counted on any device (issue 37): every op that reads a
tensor's value on the host (`float(t)`, `t.item()`, `bool(t)`, `nonzero`) stalls a GPU's queue of
launches until the device catches up. A TorchDispatchMode counts them on the CPU too, where they
cost nothing, so the count is measured without a GPU.

    python -m bench.host_syncs --workload small-4x4           # the policy's update (the calling thread)

The update of the second iteration is counted (the first warms up). With `runtime.overlap_critic`
the critic's steps run on another thread, which the mode (thread-local) does not see. Prints the
total, per optimizer step, and the busiest places (rlhf frames), then a JSON line.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import traceback

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
    """Counts the ops that read a tensor's value on the host, by the rlhf frames that called them."""

    def __init__(self) -> None:
        super().__init__()
        self.places: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in READS:
            frames = [f for f in traceback.extract_stack(limit=16)[:-2] if "/rlhf/" in f.filename]
            where = " <- ".join(
                f"{f.filename.split('/rlhf/')[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1]
            )
            self.places[(str(func).split(".")[1], where)] += 1
        return func(*args, **(kwargs or {}))


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
