"""The misuse corpus (tools/misuse_corpus.py) loaded as a module, and its shared tiny inputs, for the
tests that run its cases in this process (tests/tools, tests/reliability)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def load_corpus():
    spec = importlib.util.spec_from_file_location("misuse_corpus", REPO / "tools" / "misuse_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["misuse_corpus"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def build_inputs(corpus, tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("misuse_inputs")
    corpus.build_inputs(root)
    return root
