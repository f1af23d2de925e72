"""Every runtime implements the loop's seam (rlhf/runtime/protocol.py), and the loop uses nothing
else of a runtime: checked by the type checker (mypy, strict on the runtimes and the trainer;
pyproject.toml [tool.mypy]), here on the conformance module and on deliberately broken copies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlhf

ROOT = Path(rlhf.__file__).parent.parent
CONFORMANCE = ROOT / "tests" / "runtime" / "runtime_conformance.py"

pytestmark = pytest.mark.slow  # mypy: seconds with its cache, minutes without (it reads torch)


def broken_copy(source: str, old: str, new: str) -> str:
    """`source` with `old` (which must be there) replaced by `new`."""
    assert old in source, old
    return source.replace(old, new, 1)


def mypy(files: list[Path], search: Path) -> tuple[int, str]:
    """mypy's exit code and report on `files` under the project's settings (run from the root)."""
    env = {**os.environ, "MYPYPATH": str(search)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *map(str, files)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_the_type_checker_holds_every_runtime_and_the_trainer_to_the_protocol(tmp_path):
    """The conformance module (LocalRuntime, DistributedRuntime and RayRuntime each returned as a
    `Runtime`) checks clean; a copy of LocalRuntime without `submit_generate`, one whose `forward`
    lost its `temperature`, and a copy of the trainer reading a runtime's roles each fail."""
    local = (ROOT / "rlhf" / "runtime" / "local.py").read_text()
    trainer = (ROOT / "rlhf" / "rl" / "trainer.py").read_text()
    (tmp_path / "local_without_submit.py").write_text(
        broken_copy(local, "def submit_generate(", "def submit_generation(")
    )
    (tmp_path / "local_other_forward.py").write_text(
        broken_copy(
            local,
            "def forward(self, role: str, sequences: Sequences, temperature: float | None = None)",
            "def forward(self, role: str, sequences: Sequences)",
        )
    )
    (tmp_path / "trainer_reading_roles.py").write_text(
        broken_copy(
            trainer,
            "self.monitors = RunMonitors(c, runtime.tokenizer)",
            "self.monitors = RunMonitors(c, runtime.roles.tokenizer)",
        )  # fmt: skip
    )
    broken = tmp_path / "broken_conformance.py"
    broken.write_text(
        "from local_other_forward import LocalRuntime as OtherForward\n"
        "from local_without_submit import LocalRuntime as WithoutSubmit\n"
        "from rlhf.runtime.protocol import Runtime\n\n\n"
        "def without_submit(runtime: WithoutSubmit) -> Runtime:\n    return runtime\n\n\n"
        "def other_forward(runtime: OtherForward) -> Runtime:\n    return runtime\n"
    )
    files = [CONFORMANCE, broken, tmp_path / "trainer_reading_roles.py"]
    code, report = mypy(files, tmp_path)
    assert code == 1, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    assert not [e for e in errors if "runtime_conformance.py" in e], report
    lines = broken.read_text().splitlines()
    for function, member in (("without_submit", "submit_generate"), ("other_forward", "def forward")):
        line = next(i for i, text in enumerate(lines) if text.startswith(f"def {function}(")) + 2  # return
        # by file name: mypy repeats a cached module's report with the path it had then
        said = [said for said in report.splitlines() if f"{broken.name}:{line}: " in said]
        assert any('error: Incompatible return value type (got "LocalRuntime", expected "Runtime")' in line
                   for line in said), report  # fmt: skip
        assert any(member in line for line in said), report
    roles = [e for e in errors if "trainer_reading_roles.py" in e]
    assert len(roles) == 1 and '"Runtime" has no attribute "roles"' in roles[0], report
    assert len(errors) == 3, report
