"""Every runtime is a `Runtime` (rlhf/runtime/protocol.py) as the type checker sees it: `make lint`
and .ci/run run mypy on this module (pyproject.toml [tool.mypy] files), and
tests/runtime/test_runtime_protocol.py runs it beside broken copies, which must fail. Nothing
calls these functions: each one type-checks only if its runtime has every member of the protocol
with a compatible signature."""

from __future__ import annotations

from rlhf.ray_runtime import RayRuntime
from rlhf.runtime import DistributedRuntime, LocalRuntime
from rlhf.runtime.protocol import Runtime


def local(runtime: LocalRuntime) -> Runtime:
    return runtime


def distributed(runtime: DistributedRuntime) -> Runtime:
    return runtime


def ray(runtime: RayRuntime) -> Runtime:
    return runtime
