"""Progress of counted work and announced slow steps: done/total, elapsed and ETA from the clock."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rlhf.monitor.progress import WorkProgress, announce


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, color_system=None), buffer


def test_work_progress_prints_done_total_elapsed_and_eta():
    console, buffer = plain_console()
    clock = Clock()
    with WorkProgress("scoring", 4, "pair", console=console, live=False, plain_interval=0, clock=clock) as p:
        for _ in range(4):
            clock.now += 10  # 10 s per pair
            p.advance(1)
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "[scoring] pair 0/4 (0%) | elapsed 0:00:00 | eta -:--:--"
    assert lines[1] == "[scoring] pair 1/4 (25%) | elapsed 0:00:10 | eta 0:00:30"
    assert lines[-1] == "[scoring] pair 4/4 (100%) | elapsed 0:00:40 | eta 0:00:00"
    assert len(lines) == 5


def test_announce_prints_before_and_the_duration_after():
    console, buffer = plain_console()
    clock = Clock()
    with announce("loading the model m", console=console, clock=clock):
        clock.now += 2.5
    assert buffer.getvalue().splitlines() == ["loading the model m ...", "loading the model m: done (2.5 s)"]
    console, buffer = plain_console()
    with pytest.raises(RuntimeError), announce("loading x", console=console, clock=clock):
        raise RuntimeError("broken")
    assert buffer.getvalue().splitlines() == ["loading x ..."]  # no "done" after a failure
