"""Committed code and results name no path of the machine they were made on: the benches take their
model and data as flags or environment variables, and recorded results name files by their role."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"(?<![\w.<>])/(work|home|Users)/")  # a user's or a build machine's tree
SCRATCH_PATH = re.compile(r"(?<![\w.<>])/(tmp)/")


def offenders(files, pattern) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_code_names_no_machine_path():
    code = [
        *ROOT.glob("rlhf/**/*.py"),
        *ROOT.glob("bench/**/*.py"),
        *ROOT.glob("tools/**/*.py"),
        ROOT / "Makefile",
    ]
    assert offenders(code, MACHINE_PATH) == []


def test_bench_results_name_no_machine_or_scratch_path():
    results = sorted(ROOT.glob("bench/results/**/*.json"))
    assert results
    assert offenders(results, MACHINE_PATH) + offenders(results, SCRATCH_PATH) == []


def test_the_pattern_sees_a_machine_path():
    tree = "/" + "work"  # written in two parts, so that this file names no machine path itself
    assert MACHINE_PATH.search(f'MODEL = Path("{tree}/models/x")')
    assert not MACHINE_PATH.search(f"rlhf{tree}/x and <scratch>{tree}/x")
