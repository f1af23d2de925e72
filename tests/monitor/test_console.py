"""The console sink: bounded plain lines off a terminal, a live bar on one, ETA arithmetic."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rlhf.monitor.console import ConsoleSink, format_duration, format_value, normalize_key_metrics


class FakeClock:
    def __init__(self, step_seconds: float):
        self.now, self.step_seconds = 0.0, step_seconds

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.step_seconds


def _plain_sink(total, step_seconds, **kwargs):
    out = io.StringIO()
    clock = FakeClock(step_seconds)
    console = Console(file=out, force_terminal=False, width=250)
    sink = ConsoleSink(total, console=console, run_name="ppo", clock=clock, **kwargs)
    assert not sink.live
    return sink, clock, out


def _run(sink, clock, steps, kind="iteration"):
    for step in range(1, steps + 1):
        clock.tick()
        sink.log(step, kind, {kind: step, "reward/proxy_mean": step / 100, "kl/ref": 0.5})
    sink.close()


@pytest.mark.parametrize(("steps", "step_seconds"), [(2000, 0.01), (200, 1.0), (50, 20.0), (20, 100.0)])
def test_plain_lines_are_bounded_by_milestones_and_time(steps, step_seconds):
    sink, clock, out = _plain_sink(steps, step_seconds)
    _run(sink, clock, steps)
    lines = out.getvalue().splitlines()
    duration = steps * step_seconds
    assert 2 <= len(lines) <= 1 + 10 + duration / 30.0 + 1
    assert lines[0].startswith(f"[ppo] iteration 1/{steps}")
    assert lines[-1].startswith(f"[ppo] iteration {steps}/{steps} (100%)")


def test_plain_lines_without_total_print_first_then_every_interval_then_at_close():
    sink, clock, out = _plain_sink(None, 1.0, plain_interval=30.0)
    _run(sink, clock, 100, kind="step")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[ppo] step 1 |")
    assert [line.split(" |")[0] for line in lines] == [
        "[ppo] step 1",
        "[ppo] step 31",
        "[ppo] step 61",
        "[ppo] step 91",
        "[ppo] step 100",
    ]
    assert all("eta" not in line for line in lines)


def test_plain_line_shows_elapsed_eta_and_sticky_key_metrics():
    sink, clock, _ = _plain_sink(100, 2.0)
    for step in range(1, 51):
        clock.tick()
        record = {"iteration": step, "reward/proxy_mean": 0.123456, "kl/ref": 0.5}
        if step == 10:
            record["eval/gold"] = -1.5  # logged once, stays on the line
        sink.log(step, "iteration", record)
    line = sink.plain_line(clock.now)
    # 49 steps took 98 s since the first record: 50 steps remain at 2 s each
    assert "elapsed 0:01:40" in line and "eta 0:01:40" in line
    assert line.endswith("reward 0.123  gold -1.5  kl 0.5")
    sink.close()


def test_live_bar_on_a_terminal_shows_progress_and_metrics():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    sink = ConsoleSink(10, console=console, run_name="ppo_max")
    assert sink.live
    for step in range(1, 11):
        sink.log(step, "iteration", {"iteration": step, "policy_ppl": 2.5, "response_length": 17.0})
    sink.warn({"event": "warning", "iteration": 10, "message": "[bold]not markup[/bold]"})
    sink.close()
    text = out.getvalue()
    assert "ppo_max" in text and "10/10" in text
    assert "ppl 2.5" in text and "len 17" in text
    assert "[bold]not markup[/bold]" in text  # the message is escaped, not interpreted


def test_phases_count_their_own_units_with_their_own_eta():
    sink, clock, out = _plain_sink({"pretrain": 4, "iteration": 10}, 1.0, indexed=True)
    for kind, steps in (("pretrain", 4), ("iteration", 10)):
        for index in range(steps):
            clock.tick()
            sink.log(index, kind, {kind: index})
    sink.close()
    heads = [line.split(" |")[0] for line in out.getvalue().splitlines()]
    assert heads[0] == "[ppo] pretrain 1/4 (25%)" and "[ppo] pretrain 4/4 (100%)" in heads
    assert heads[heads.index("[ppo] pretrain 4/4 (100%)") + 1] == "[ppo] iteration 1/10 (10%)"
    assert heads[-1] == "[ppo] iteration 10/10 (100%)"


def test_status_names_the_part_of_a_first_or_long_step():
    sink, clock, out = _plain_sink(5, 1.0, indexed=True, plain_interval=30.0)
    sink.status("sampling", 0, "iteration")  # the first step: said at once
    clock.tick()
    sink.log(0, "iteration", {"iteration": 0})
    sink.status("sampling", 1, "iteration")  # a short later step: nothing
    clock.now += 40  # ... but one that has printed nothing for plain_interval: said
    sink.status("updating", 1, "iteration")
    sink.close()
    heads = [line.split(" |")[0] for line in out.getvalue().splitlines()]
    assert heads == [
        "[ppo] iteration 1/5: sampling ...",
        "[ppo] iteration 1/5 (20%)",
        "[ppo] iteration 2/5: updating ...",
    ]
    live_out = io.StringIO()
    live = ConsoleSink(5, console=Console(file=live_out, force_terminal=True, width=160), indexed=True)
    live.status("scoring", 0, "iteration")
    live._progress.refresh()
    live.close()
    assert "iteration 1: scoring" in live_out.getvalue() and "0/5" in live_out.getvalue()


def test_key_metrics_accept_mapping_keys_and_pairs():
    assert normalize_key_metrics({"r": "reward/mean"}) == [("r", "reward/mean")]
    assert normalize_key_metrics(["loss", ("acc", "eval/accuracy")]) == [
        ("loss", "loss"),
        ("acc", "eval/accuracy"),
    ]
    with pytest.raises(ValueError, match="key_metrics"):
        normalize_key_metrics([("a", "b", "c")])


def test_formatting_helpers():
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(None) == "-:--:--"
    assert format_duration(float("inf")) == "-:--:--"
    assert format_value(0.0123456) == "0.0123"
    assert format_value(12) == "12"
    assert format_value(True) == "True"
