"""Record conversion and the metrics.jsonl reader / truncation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.monitor.records import (
    dumps_record,
    flatten_metrics,
    read_metrics,
    record_step,
    to_json_value,
    truncate_after,
)


def _strict_loads(line: str):
    def reject(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=reject)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (torch.tensor(1.5), 1.5),
        (torch.tensor([2.5]), 2.5),
        (torch.tensor([1.0, 2.0]), [1.0, 2.0]),
        (np.float32(0.25), 0.25),
        (np.int64(7), 7),
        (np.array(3.0), 3.0),
        (np.bool_(True), True),
        (float("nan"), None),
        (float("inf"), None),
        (-float("inf"), None),
        (torch.tensor(float("nan")), None),
        (np.float64("nan"), None),
        ([1.0, float("nan"), np.float32(2.0)], [1.0, None, 2.0]),
        (True, True),
        (3, 3),
        ("text", "text"),
        (None, None),
    ],
)
def test_to_json_value_converts_tensors_numpy_and_non_finite(value, expected):
    converted = to_json_value(value)
    assert converted == expected
    assert type(converted) is type(expected)


def test_to_json_value_keeps_ints_int_and_tensor_grad_is_detached():
    assert isinstance(to_json_value(torch.tensor(3)), int)
    weight = torch.tensor(2.0, requires_grad=True)
    assert to_json_value(weight * 2) == 4.0


def test_to_json_value_names_the_key_of_an_unloggable_value():
    with pytest.raises(TypeError, match="'policy/odd'"):
        to_json_value(object(), "policy/odd")


def test_flatten_metrics_joins_nested_keys_and_rejects_non_string_keys():
    flat = flatten_metrics({"kl": {"ref": torch.tensor(0.5), "old": {"k3": 1}}, "len": 3})
    assert flat == {"kl/ref": 0.5, "kl/old/k3": 1, "len": 3}
    with pytest.raises(TypeError, match="strings"):
        flatten_metrics({1: 2.0})


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.floats(allow_nan=True, allow_infinity=True), max_size=8
    )
)
@pytest.mark.slow
def test_any_float_metrics_give_strict_json_that_round_trips(metrics):
    line = dumps_record(flatten_metrics(metrics))
    parsed = _strict_loads(line)
    for key, value in metrics.items():
        assert parsed[key] == (value if math.isfinite(value) else None)


def test_read_metrics_skips_only_an_interrupted_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1, "a": 1.0}\n{"iteration": 2, "a": 2.0}\n{"iteration": 3, "a"')
    assert [r["iteration"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"iteration": 1}\n{"iteration": 2, "a"\n{"iteration": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2:"):
        read_metrics(path)
    path.write_text('{"iteration": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: expected a JSON object"):
        read_metrics(path)


def test_record_step_reads_iteration_or_step():
    assert record_step({"iteration": 4}) == 4
    assert record_step({"step": 9, "loss": 1.0}) == 9
    assert record_step({"event": "warning"}) is None
    assert record_step({"iteration": True}) is None


def test_truncate_after_keeps_steps_up_to_and_records_without_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"iteration": i} for i in range(1, 6)] + [{"event": "warning", "iteration": 5, "message": "m"}]
    lines.insert(0, {"event": "start"})
    path.write_text("".join(dumps_record(r) + "\n" for r in lines) + '{"iteration": 6, "x"')
    kept = truncate_after(path, 3)
    records = read_metrics(path)
    assert kept == 4
    assert records == [{"event": "start"}, {"iteration": 1}, {"iteration": 2}, {"iteration": 3}]
    assert path.read_text().endswith("\n")
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
