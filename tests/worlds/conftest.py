import pytest
from worlds_testing import FULL_POOLS

from rlhf.worlds import WorldConfig, build_world


@pytest.fixture(scope="session")
def world():
    """The default world."""
    return build_world(WorldConfig())


@pytest.fixture(scope="session")
def full_world():
    """A world holding every pool word, so hand-written responses can use any of them."""
    return build_world(WorldConfig(**FULL_POOLS))
