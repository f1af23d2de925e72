"""StepStats (rlhf/train/step_stats.py): an optimizer step's stats as token-weighted means over its
micro-batches, `_max`/`_min` keys by max/min; the micro-batches' tensors are read from the device
once, at `result` (on a GPU every read is a host-device sync), and the figures are those of Python
floats exactly."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhf.train.step_stats import StepStats, merged_step_stats

# what reads a tensor's value on the host (`float(t)`, `t.item()`, `t.tolist()` of a scalar, `bool(t)`)
READS = {"aten._local_scalar_dense.default", "aten.item.default"}


class HostReads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func) in READS
        return func(*args, **(kwargs or {}))


MICRO = [  # (stats of a micro-batch, its weight)
    ({"loss": torch.tensor(0.25), "clipfrac": torch.tensor(0.1), "ratio_max": torch.tensor(1.3),
      "ratio_min": torch.tensor(0.7)}, 0.5),
    ({"loss": torch.tensor(-0.125), "clipfrac": torch.tensor(0.3), "ratio_max": torch.tensor(1.7),
      "ratio_min": torch.tensor(0.9)}, 0.3),
    ({"loss": torch.tensor(1.0), "clipfrac": 0.0, "ratio_max": torch.tensor(1.1),
      "ratio_min": torch.tensor(0.4)}, 0.2),
    ({"loss": torch.tensor(9.0), "clipfrac": torch.tensor(9.0), "ratio_max": torch.tensor(9.0),
      "ratio_min": torch.tensor(-9.0)}, 0.0),  # a filler: weight 0 adds nothing
]  # fmt: skip


def python_floats_reference() -> dict[str, float]:
    """The plain loop over Python floats that StepStats computed before it deferred its reads."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    extremes: dict[str, float] = {}
    for stats, weight in MICRO:
        if weight <= 0:
            continue
        for key, value in stats.items():
            name = f"policy/{key}"
            if key.endswith(("_max", "_min")):
                pick = max if key.endswith("_max") else min
                extremes[name] = pick(extremes.get(name, float(value)), float(value))
                continue
            sums[name] = sums.get(name, 0.0) + float(value) * weight
            weights[name] = weights.get(name, 0.0) + weight
    return {**{k: sums[k] / max(weights[k], 1e-12) for k in sums}, **extremes}


def test_the_micro_batches_are_read_once_and_give_the_python_float_figures_exactly():
    stats = StepStats()
    with HostReads() as adding:
        for micro, weight in MICRO:
            stats.add(micro, weight, "policy")
    assert adding.count == 0  # nothing read from the device while the micro-batches run
    with HostReads() as reading:
        result = stats.result()
    assert reading.count <= 1  # one batched transfer (`tolist` of one tensor: no dispatched op on a CPU)
    assert result == python_floats_reference()  # exactly, float64 as Python's floats
    assert result["policy/ratio_max"] == float(torch.tensor(1.7)) and result["policy/ratio_min"] == float(
        torch.tensor(0.4)
    )


def test_a_step_of_plain_floats_and_an_empty_step():
    stats = StepStats()
    stats.add({"loss": 2.0, "kl_max": 0.5}, 1.0, "policy")
    stats.add({"loss": 4.0, "kl_max": 0.25}, 1.0, "policy")
    assert stats.result() == {"policy/loss": 3.0, "policy/kl_max": 0.5}
    assert StepStats().result() == {}


def test_the_ranks_merge_the_floats_they_read():
    a, b = StepStats(), StepStats()
    a.add({"loss": torch.tensor(1.0), "ratio_max": torch.tensor(2.0)}, 0.25, "policy")
    b.add({"loss": torch.tensor(3.0), "ratio_max": torch.tensor(1.5)}, 0.75, "policy")
    parts = []
    for s in (a, b):
        sums, extremes = s._read()
        assert all(type(v) is float for v in [*sums.values(), *extremes.values()])
        parts.append((sums, s.weights, extremes, s.moments()))
    merged = merged_step_stats(parts)
    assert merged == {"policy/loss": 1.0 * 0.25 + 3.0 * 0.75, "policy/ratio_max": 2.0}
