"""Every module of the package opens with a docstring of at most 10 lines that states its contract;
rationale and measured figures belong to the docs page that owns them (docs/), formulas to the
function they describe."""

from __future__ import annotations

import ast
from pathlib import Path

import rlhf

PACKAGE = Path(rlhf.__file__).parent
MAX_LINES = 10


def test_every_module_docstring_is_at_most_10_lines():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc is not None and len(doc.strip("\n").splitlines()) > MAX_LINES:
            long[str(path.relative_to(PACKAGE.parent))] = len(doc.strip("\n").splitlines())
    assert long == {}, f"module docstrings over {MAX_LINES} lines: {long}"
