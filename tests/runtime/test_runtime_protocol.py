"""Every runtime implements the loop's seam (rlhf/runtime/protocol.py) with the same signatures."""

from __future__ import annotations

import inspect

import pytest

from rlhf.ray_runtime import RayRuntime
from rlhf.runtime import DistributedRuntime, LocalRuntime
from rlhf.runtime.protocol import Runtime

MEMBERS = [name for name in vars(Runtime) if not name.startswith("_")] + list(Runtime.__annotations__)


@pytest.mark.parametrize("runtime", [LocalRuntime, DistributedRuntime, RayRuntime], ids=lambda r: r.__name__)
def test_each_runtime_has_every_call_of_the_seam_with_its_parameters(runtime):
    for name in MEMBERS:
        assert hasattr(runtime, name), f"{runtime.__name__} lacks {name}"
        wanted = getattr(Runtime, name, None)
        if inspect.isfunction(wanted):
            got = inspect.signature(getattr(runtime, name)).parameters
            assert list(got) == list(inspect.signature(wanted).parameters), name


def test_the_trainer_reaches_roles_only_through_its_runtime():
    """The loop's source names no role attribute (`self.roles.` / `roles.`) outside the local
    runtime's construction and the test-facing `sample_generator`."""
    import rlhf.rl.trainer as trainer

    source = inspect.getsource(trainer)
    uses = [line.strip() for line in source.splitlines() if "roles." in line and "import" not in line]
    assert uses == ["return self.roles.policy.generator"], uses
