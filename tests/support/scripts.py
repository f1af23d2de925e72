"""Run an example's script in this process as `python SCRIPT ARGS` would (tests.support.scripts):
no interpreter start-up and torch import to pay, which dominate a tiny example's run."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest


def run_script(monkeypatch: pytest.MonkeyPatch, script: Path, *args) -> None:
    """`script` run as __main__ with `args` as its command line and its folder first on sys.path (as
    `python SCRIPT` puts it); an exit with a code other than 0 fails the test. sys.argv, sys.path and
    the modules imported from the script's folder or the one above it are restored afterwards."""
    examples = str(Path(script).resolve().parents[1])
    monkeypatch.setattr(sys, "argv", [str(script), *map(str, args)])
    monkeypatch.setattr(sys, "path", [str(Path(script).parent), *sys.path])
    before = set(sys.modules)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (0, None), f"{script} exited with {stop.code}"
    finally:
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            places = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
            if any(str(place).startswith(examples) for place in places):
                del sys.modules[name]
