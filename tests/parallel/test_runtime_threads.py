"""The CPU scheduling pieces of the local runtime, without a trainer: two pieces of work side by
side on two threads (run_side_by_side, side_by_side_threads, by_row_halves: rlhf/parallel/threads.py)
and the FLOP counts that decide when it pays (handover_step, training_flops_per_token,
forward_flops: rlhf/runtime/flops.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from rlhf.parallel.threads import by_row_halves, run_side_by_side, side_by_side_threads
from rlhf.runtime.flops import (
    MIN_HANDOVER_STEP_FLOPS,
    forward_flops,
    handover_step,
    training_flops_per_token,
)

# -- run_side_by_side ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_omp_limit(monkeypatch):
    """The tests set the cores they need (available_cores); OMP_NUM_THREADS in the environment
    of the suite would cap the side-by-side threads under them (threads.thread_budget)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_side_by_side_runs_every_step_in_order_on_two_threads_and_restores_threads():
    torch.set_num_threads(1)
    seen: dict[str, list] = {"here": [], "beside": []}

    def step(side: str, i: int):
        def run():
            seen[side].append((i, threading.current_thread().name, torch.get_num_threads()))

        return run

    run_side_by_side([step("here", i) for i in range(4)], [step("beside", i) for i in range(3)], 1)
    assert [i for i, _, _ in seen["here"]] == [0, 1, 2, 3]
    assert [i for i, _, _ in seen["beside"]] == [0, 1, 2]
    assert {name for _, name, _ in seen["here"]} == {threading.current_thread().name}
    assert {name for _, name, _ in seen["beside"]} == {"rlhf-side-by-side"}
    assert {n for side in seen.values() for _, _, n in side} == {1}
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("failing", ["here", "beside"])
def test_side_by_side_reraises_an_error_and_the_other_side_stops(failing):
    torch.set_num_threads(1)
    started = threading.Event()  # the other side is inside its first step
    gate = threading.Event()  # the failing side's error is recorded before the other side goes on
    ran: list[str] = []

    def boom():
        started.wait(timeout=30)
        try:
            raise RuntimeError(f"{failing} failed")
        finally:
            gate.set()

    def wait_then(name):
        def run():
            started.set()
            gate.wait(timeout=30)
            ran.append(name)

        return run

    failing_steps = [boom, lambda: ran.append("after the error")]
    other_steps = [wait_then("first"), lambda: ran.append("second"), lambda: ran.append("third")]
    here, beside = (failing_steps, other_steps) if failing == "here" else (other_steps, failing_steps)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        run_side_by_side(here, beside, 1)
    assert ran == ["first"]  # the other side finished the step it was in, then stopped
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("handover_at", [0, 2, 4, 9])
def test_the_longer_side_takes_every_thread_once_the_other_is_done(handover_at):
    """Steps from `handover_at` on run after the helper's last step, with this thread's own count."""
    torch.set_num_threads(2)
    helper_done = threading.Event()
    here: list[tuple[int, int, bool]] = []

    def step_here(i: int):
        return lambda: here.append((i, torch.get_num_threads(), helper_done.is_set()))

    beside = [lambda: None] * 3 + [helper_done.set]
    run_side_by_side([step_here(i) for i in range(4)], beside, 1, handover_at)
    assert [i for i, _, _ in here] == [0, 1, 2, 3]
    for i, threads, done in here:
        if i >= handover_at:
            assert (threads, done) == (2, True)
        else:
            assert threads == 1
    assert torch.get_num_threads() == 2


def test_no_step_runs_after_the_hand_over_when_the_helper_failed():
    torch.set_num_threads(1)
    ran: list[int] = []

    def boom():
        raise RuntimeError("helper failed")

    with pytest.raises(RuntimeError, match="helper failed"):
        run_side_by_side([lambda: ran.append(0), lambda: ran.append(1)], [boom], 1, handover_at=1)
    assert ran in ([], [0])  # step 0 may start before the helper's error; step 1 never runs
    assert torch.get_num_threads() == 1


def test_side_by_side_threads_split_the_intra_op_threads(monkeypatch):
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 1)
    assert side_by_side_threads() is None  # one core: two threads would only take turns
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 8)
    previous = torch.get_num_threads()
    try:
        for threads, each in [(1, 1), (2, 1), (4, 2), (5, 2)]:
            torch.set_num_threads(threads)
            assert side_by_side_threads() == each
    finally:
        torch.set_num_threads(previous)


# -- by_row_halves: the two halves of a forward's rows ---------------------------------------------------


@pytest.mark.parametrize("rows, threads_each, calls", [(5, 1, 2), (5, None, 1), (1, 1, 1)])
def test_row_halves_are_joined_in_order_under_the_callers_autograd_mode(rows, threads_each, calls):
    torch.set_num_threads(1)
    seen = []

    def compute(where: slice) -> torch.Tensor:
        seen.append((where, threading.current_thread().name, torch.is_inference_mode_enabled()))
        return torch.arange(rows)[where] * 10

    with torch.inference_mode():
        out = by_row_halves(compute, rows, threads_each)
    assert torch.equal(out, torch.arange(rows) * 10)
    assert len(seen) == calls
    assert all(inference for _, _, inference in seen)  # the helper thread too
    if calls == 2:
        assert sorted((w.start, w.stop) for w, _, _ in seen) == [(0, 3), (3, 5)]
        assert {name for _, name, _ in seen} == {threading.current_thread().name, "rlhf-side-by-side"}
    assert torch.get_num_threads() == 1


# -- FLOP counts: when more threads pay --------------------------------------------------------------------

G = 1e9  # FLOPs


@pytest.mark.parametrize(
    "steps_here, flops_here, steps_beside, flops_beside, expected",
    [
        (16, 5.5 * G, 16, 0.86 * 5.5 * G, 14),  # ceil(13.76): small-4x4's measured critic/policy ratio
        (16, 4 * G, 16, 2 * G, 8),  # exactly on a step: no extra step beside
        (16, 4 * G, 16, 4 * G, 16),  # equal sides: no hand-over
        (4, 4 * G, 8, 1 * G, 2),  # unequal step counts
        (16, 0.2 * G, 16, 0.1 * G, 16),  # tiny steps: more threads would slow them down
    ],
)
def test_handover_step_is_where_the_shorter_side_is_predicted_done(
    steps_here, flops_here, steps_beside, flops_beside, expected
):
    assert handover_step(steps_here, flops_here, steps_beside, flops_beside) == expected


def test_handover_needs_steps_large_enough_for_more_threads():
    assert handover_step(16, MIN_HANDOVER_STEP_FLOPS, 16, MIN_HANDOVER_STEP_FLOPS / 2) == 8
    assert handover_step(16, MIN_HANDOVER_STEP_FLOPS * 0.99, 16, MIN_HANDOVER_STEP_FLOPS / 2) == 16


def test_training_flops_count_weight_matrices_not_embeddings_or_vectors():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 4), torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))
    assert training_flops_per_token([model]) == 32 * 6  # forward, input gradient, weight gradient
    model[1].weight.requires_grad_(False)
    assert training_flops_per_token([model]) == 32 * 4  # frozen (LoRA base): no weight gradient
    head = torch.nn.Linear(8, 10, bias=False)
    assert training_flops_per_token([model, head], scale=[1.0, 0.5]) == 32 * 4 + 80 * 6 * 0.5


def test_forward_flops_count_two_per_weight_matrix_and_token():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    assert forward_flops([model], tokens=5) == 2 * 5 * (4 * 3)
