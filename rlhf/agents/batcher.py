"""The pending requests of concurrent episodes, decoded together: a request waits at most
`window_s` for others to join it, or until `target()` requests wait; then the sampler runs once
over the batch (left-padded by the sampler) and each request gets its rows back.

The batch runs on the thread that calls `run_ready` (the trainer's: every model call stays on it);
the requests come from the server's handler threads and wait on their futures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from rlhf.models.sampling import Rollout


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings; requests with equal ones share a batch."""

    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class Sampled:
    """One sampled continuation: its tokens (the end-of-turn token included when it ended there)."""

    tokens: list[int]
    logprobs: list[float]
    ended_with_eos: bool


@dataclass
class Pending:
    context: list[int]
    sampling: Sampling
    max_new_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    future: Future[Sampled] = field(default_factory=Future)


# the sampler: (contexts, sampling, max_new_tokens) -> a Rollout with log-probs, one row per context
Backend = Callable[[list[list[int]], Sampling, int], Rollout]


def unpack(rollout: Rollout) -> list[Sampled]:
    """Each row of a sampled batch: its response tokens and their log-probs."""
    assert rollout.logprobs is not None, "the agent server's sampler keeps the sampled tokens' log-probs"
    lengths = rollout.response_mask.sum(-1).long().tolist()
    ids, logprobs = rollout.response_ids.tolist(), rollout.logprobs.tolist()
    eos = rollout.ended_with_eos.tolist()
    return [Sampled(ids[i][:n], logprobs[i][:n], bool(eos[i])) for i, n in enumerate(lengths)]


class Batcher:
    def __init__(self, backend: Backend, *, window_s: float, honours_sampling: bool) -> None:
        self.backend = backend
        self.window_s = window_s
        self.honours_sampling = honours_sampling  # else every request shares the backend's own settings
        self.pending: list[Pending] = []
        self.ready = threading.Condition()
        self.batches: list[int] = []  # the rows of each sampler call (agent/batch_size_mean)

    def submit(self, context: list[int], sampling: Sampling, max_new_tokens: int) -> Future[Sampled]:
        request = Pending(context, sampling if self.honours_sampling else Sampling(), max_new_tokens)
        with self.ready:
            self.pending.append(request)
            self.ready.notify_all()
        return request.future

    def take(self, target: int, wait_s: float) -> list[Pending]:
        """The next batch: once `target` requests wait, or the oldest has waited `window_s`; [] when
        none is due within `wait_s`."""
        deadline = time.monotonic() + wait_s
        with self.ready:
            while True:
                now = time.monotonic()
                if self.pending and (
                    len(self.pending) >= max(1, target) or now - self.pending[0].arrived >= self.window_s
                ):
                    batch, self.pending = self.pending, []
                    return batch
                due = self.pending[0].arrived + self.window_s if self.pending else deadline
                if now >= deadline:
                    return []
                self.ready.wait(max(0.0, min(due, deadline) - now))

    def run(self, batch: list[Pending]) -> None:
        """Sample `batch` (one sampler call per distinct sampling setting) and answer each request;
        the sampler's own error fails every request of the batch and is raised here."""
        groups: dict[Sampling, list[Pending]] = {}
        for request in batch:
            groups.setdefault(request.sampling, []).append(request)
        for sampling, requests in groups.items():
            longest = max(r.max_new_tokens for r in requests)
            try:
                with torch.inference_mode():
                    rows = unpack(self.backend([r.context for r in requests], sampling, longest))
            except BaseException as err:
                for r in requests:
                    r.future.set_exception(RuntimeError(f"the policy's sampler failed: {err}"))
                raise
            self.batches.append(len(requests))
            for r, row in zip(requests, rows, strict=True):
                if len(row.tokens) > r.max_new_tokens:  # a shorter max_tokens than the batch's: cut
                    row = Sampled(row.tokens[: r.max_new_tokens], row.logprobs[: r.max_new_tokens], False)
                r.future.set_result(row)

    def fail_all(self, message: str) -> None:
        with self.ready:
            batch, self.pending = self.pending, []
        for r in batch:
            r.future.set_exception(RuntimeError(message))
