"""rlhf.core is pure tensor math: it imports no other layer of rlhf. rlhf.config may import core
(the loss and estimator registries name the policy.loss and advantage.estimator choices) and
nothing else of rlhf."""

from __future__ import annotations

import ast
from pathlib import Path

import rlhf.config
import rlhf.core


def rlhf_imports(source: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [name for name in names if name == "rlhf" or name.startswith("rlhf.")]


def test_no_module_of_core_imports_another_layer():
    package = Path(rlhf.core.__file__).parent
    offenders = [
        f"{source.name}: {name}"
        for source in sorted(package.glob("*.py"))
        for name in rlhf_imports(source)
        if not name.startswith("rlhf.core")
    ]
    assert offenders == []


def test_config_imports_only_core():
    package = Path(rlhf.config.__file__).parent
    imports = [name for source in sorted(package.glob("*.py")) for name in rlhf_imports(source)]
    outside = [name for name in imports if not name.startswith(("rlhf.core", "rlhf.config"))]
    assert any(name.startswith("rlhf.core") for name in imports) and outside == [], outside
