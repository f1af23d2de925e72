"""The misuse corpus (tools/misuse_corpus.py) as session fixtures, a plugin of tests/conftest.py:
`misuse_corpus` (the tool loaded as a module) and `misuse_inputs` (its shared tiny inputs, built once
per session and worker), for the tests that run its cases in this process (tests/tools,
tests/reliability)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def load_corpus():
    spec = importlib.util.spec_from_file_location("misuse_corpus", REPO / "tools" / "misuse_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["misuse_corpus"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def misuse_corpus():
    return load_corpus()


@pytest.fixture(scope="session")
def misuse_inputs(misuse_corpus, tmp_path_factory) -> Path:
    """Read-only for the tests: each case copies it into its own work folder."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("misuse_inputs")
    misuse_corpus.build_inputs(root)
    return root
