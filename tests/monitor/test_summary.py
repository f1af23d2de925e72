"""The end-of-run summary table."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from rlhf.monitor import print_summary
from rlhf.monitor.summary import format_cell


def _console():
    return Console(file=io.StringIO(), width=120, color_system=None)


def test_dict_gives_metric_value_rows_and_is_written_to_path(tmp_path):
    console = _console()
    path = tmp_path / "out" / "summary.txt"
    text = print_summary(
        "ppo_max seed 0", {"gold": 0.61234, "kl": {"ref": 3.9}, "collapse": False}, path=path, console=console
    )
    assert path.read_text() == text
    assert "ppo_max seed 0" in text
    lines = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in text.splitlines()
        if line.count("│") == 3
    }
    assert lines == {"gold": "0.6123", "kl/ref": "3.9", "collapse": "no"}
    assert "0.6123" in console.file.getvalue()


def test_rows_give_one_column_per_key_in_first_seen_order():
    text = print_summary(
        "final",
        [{"algorithm": "ppo", "gold": (0.2, 0.05)}, {"algorithm": "apa", "kl": 1.0, "gold": float("nan")}],
        console=_console(),
    )
    header = next(line for line in text.splitlines() if "algorithm" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == ["algorithm", "gold", "kl"]
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.count("│") == 4
    ]
    assert rows == [["ppo", "0.2 ± 0.05", "-"], ["apa", "-", "1"]]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"),
        (True, "yes"),
        (3, "3"),
        (float("inf"), "-"),
        (np.float32(0.5), "0.5"),
        ((1.0, 0.25), "1 ± 0.25"),
        ("ok", "ok"),
    ],
)
def test_format_cell(value, shown):
    assert format_cell(value) == shown


def test_rejects_what_is_not_a_dict_or_rows():
    with pytest.raises(TypeError, match="dict or a list of dicts"):
        print_summary("x", "gold 1", console=_console())
    with pytest.raises(TypeError, match="every row"):
        print_summary("x", [1, 2], console=_console())
