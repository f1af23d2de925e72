"""The passes of one optimizer step under data parallelism: gradients reduced in the last only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class Accumulation:
    """The `passes` forward/backward passes of one optimizer step, each entered with `next_pass()`:
    the gradients are reduced over the ranks in the last pass's backward only, the other passes
    running inside `local()` (DDP's `no_sync`; fsdp2 with `dist.grad_sync step`: FSDP2's
    `set_requires_gradient_sync(False)`, rlhf/parallel/replicated.py); `local` None: every pass
    reduces (one process, fsdp2's per-micro-batch reduction). `finish` checks that the reducing
    pass ran."""

    def __init__(
        self, passes: int, local: Callable[[], contextlib.AbstractContextManager[None]] | None
    ) -> None:
        self.passes = passes
        self.local = local
        self.done = 0

    @contextlib.contextmanager
    def next_pass(self) -> Iterator[None]:
        self.done += 1
        if self.done > self.passes:
            raise RuntimeError(f"an optimizer step of {self.passes} passes ran pass {self.done}")
        with self.local() if self.local is not None and self.done < self.passes else contextlib.nullcontext():
            yield

    def finish(self) -> None:
        if self.done != self.passes:
            raise RuntimeError(
                f"an optimizer step ran {self.done} of its {self.passes} forward/backward passes: the last, "
                "which reduces the gradients over the ranks, did not run"
            )
