import pytest

from rlhf.worlds import WorldConfig, build_world
from tests.support.worlds_testing import FULL_POOLS


@pytest.fixture(scope="session")
def world():
    """The default world."""
    return build_world(WorldConfig())


@pytest.fixture(scope="session")
def full_world():
    """A world holding every pool word, so hand-written responses can use any of them."""
    return build_world(WorldConfig(**FULL_POOLS))
