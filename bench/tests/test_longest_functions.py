"""bench/tools/longest_functions.py counts a function from its `def` to its last line and names methods
and nested functions with their owners."""

from __future__ import annotations

from pathlib import Path

from bench.tools.longest_functions import longest_functions

SOURCE = '''
import functools


@functools.cache
def short():
    return 1


class Box:
    def method(self):
        """Four lines."""
        x = 1
        return x

    def outer(self):
        def inner():
            return 2

        return inner()
'''


def test_lengths_and_names(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(SOURCE)
    rows = longest_functions(package, most=10)
    assert rows == [
        (5, "pkg/mod.py:16 Box.outer"),
        (4, "pkg/mod.py:11 Box.method"),
        (2, "pkg/mod.py:17 Box.outer.inner"),
        (2, "pkg/mod.py:6 short"),
    ]
    assert longest_functions(package, most=1) == rows[:1]
