"""rlhf.monitor is pure logging and plotting: it imports no other layer of rlhf."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rlhf.monitor

FORBIDDEN = ("rlhf.train", "rlhf.worlds", "rlhf.models", "rlhf.data", "rlhf.cli", "rlhf.config")


def test_no_module_of_the_monitor_imports_another_layer():
    package = Path(rlhf.monitor.__file__).parent
    offenders = []
    for source in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{source.name}: {name}" for name in names if name.startswith(FORBIDDEN)]
    assert offenders == []


def test_importing_the_logger_loads_neither_other_layers_nor_matplotlib_nor_torch():
    code = (
        "import sys, rlhf.monitor\n"
        "from rlhf.monitor import MetricsLogger, CollapseDetector\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rlhf.', 'matplotlib', 'torch'))))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "matplotlib" not in loaded and "'torch'" not in loaded
    assert not any(name in loaded for name in FORBIDDEN)
    assert "rlhf.monitor.logger" in loaded
