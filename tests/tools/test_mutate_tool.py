"""tools/mutate.py on a tiny package in tmp_path: it finds, applies and classifies mutants."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("mutate_tool", REPO / "tools" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""A docstring: never mutated."""
import math

LIMIT = 10


def add(a, b):
    return a + b


def is_small(x):
    if x < 0:
        raise ValueError(f"x must be >= {0}, got {x}")
    return x < LIMIT


def spin(n):
    i = 0
    while i < n:
        i += 1
    return i


def biggest(values):
    return max(values)
'''

TESTS = """from pkg.calc import add, biggest, is_small, spin


def test_add():
    assert add(2, 3) == 5


def test_is_small():
    assert is_small(3)


def test_spin():
    assert spin(3) == 3


def test_biggest():
    assert biggest([1, 4, 2]) == 4
"""


def mutations(mutants) -> set[str]:
    return {f"{m.original} -> {m.replacement}" for m in mutants}


def test_finds_each_kind_and_skips_docstrings_and_messages(mutate) -> None:
    mutants = mutate.find_mutants("pkg/calc.py", SOURCE.encode())
    found = mutations(mutants)
    assert {"a + b -> (a - b)", "x < LIMIT -> (x <= LIMIT)", "10 -> 11", "max(values) -> (min(values))",
            "i += 1 -> pass", "return a + b -> return None", "0 -> 1"} <= found  # fmt: skip
    assert {m.kind for m in mutants} >= {"operator", "comparison", "constant", "reduction", "return",
                                         "statement removed"}  # fmt: skip
    assert not any("docstring" in m.original or "must be" in m.replacement for m in mutants)
    assert not any(m.original == "math" for m in mutants)
    for m in mutants:  # each applies to a parseable program that differs from the original
        mutated = m.apply(SOURCE.encode()).decode()
        assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(SOURCE))
        assert SOURCE.splitlines()[m.line - 1][m.column - 1 :].startswith(m.original.split(" ")[0])
    swap = mutate.find_mutants("m.py", b"x = pow(2, 3)\n")
    assert "pow(2, 3) -> (pow(3, 2))" in mutations(swap)


def test_limit_is_a_seeded_sample_in_source_order(mutate) -> None:
    mutants = mutate.find_mutants("pkg/calc.py", SOURCE.encode())
    first = mutate.choose(mutants, 4, seed=1)
    assert first == mutate.choose(mutants, 4, seed=1) and len(first) == 4
    assert first == sorted(first, key=mutants.index)
    assert mutate.choose(mutants, None, seed=1) == mutants


@pytest.mark.slow
def test_runs_mutants_and_classifies_them(mutate, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "calc.py").write_text(SOURCE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(TESTS)
    wanted = {"a + b -> (a - b)", "x < LIMIT -> (x <= LIMIT)", "i += 1 -> pass", "x < 0 -> (x <= 0)"}
    chosen = [
        m
        for m in mutate.find_mutants("pkg/calc.py", SOURCE.encode())
        if f"{m.original} -> {m.replacement}" in wanted
    ]
    equivalent = next(m.key for m in chosen if m.original == "x < 0")
    original_choose = mutate.choose
    mutate.choose = lambda mutants, limit, seed: [m for m in mutants if m in chosen]
    try:
        report = mutate.mutate(["pkg/calc.py"], root=tmp_path, test_map={"pkg/*.py": ["tests/test_{stem}.py"]},
                               jobs=1, timeout=3, equivalents={equivalent}, log=lambda s: None)  # fmt: skip
    finally:
        mutate.choose = original_choose
    result = report["files"]["pkg/calc.py"]
    assert (result["mutants"], result["killed"], result["survived"], result["timeout"]) == (4, 1, 2, 1)
    assert result["kill_rate"] == 0.5 and result["equivalent"] == 1
    assert result["kill_rate_non_equivalent"] == pytest.approx(2 / 3)
    assert [s.split("  [")[0] for s in result["survivors"]] == [
        next(m.key for m in chosen if m.original == "x < LIMIT")
    ]
    assert (tmp_path / "pkg" / "calc.py").read_text() == SOURCE  # the working tree is never edited
    json.dumps(report)
    assert "pkg/calc.py" in mutate.table(report)


def test_equivalents_are_read_from_a_markdown_list(mutate, tmp_path: Path) -> None:
    doc = tmp_path / "mutation.md"
    doc.write_text(
        "# x\n- `rlhf/a.py:3:5: x < 1 -> (x <= 1)`: x is an int below 1 or 2\ntext `b.py:1:1: no`\n"
    )
    assert mutate.read_equivalents(doc) == {"rlhf/a.py:3:5: x < 1 -> (x <= 1)"}


def test_unknown_file_is_a_usage_error(mutate, capsys) -> None:
    assert mutate.main(["--files", "rlhf/core/nowhere.py", "--list"]) == 2
    assert "rlhf/core/nowhere.py" in capsys.readouterr().err
