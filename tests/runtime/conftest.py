"""Fixtures of the runtime tests: the trainer tests' own (`make_trainer`, `tok`, `prompts`, `models`
from tests/train/conftest.py, on the same tiny models) and their helpers (`train_testing`).

The test directories are not packages: tests/train goes on sys.path as pytest puts it there for
its own tests, and its conftest is loaded under a name of its own, so both work when tests/runtime
runs alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TRAIN_TESTS = Path(__file__).resolve().parent.parent / "train"
if str(TRAIN_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAIN_TESTS))  # `from train_testing import ...`, as in tests/train


def _train_conftest():
    spec = importlib.util.spec_from_file_location("train_conftest", TRAIN_TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_train = _train_conftest()
tok = _train.tok
prompts = _train.prompts
_models = _train._models
models = _train.models
make_trainer = _train.make_trainer
