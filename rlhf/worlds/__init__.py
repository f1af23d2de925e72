"""Built-in synthetic worlds with a known gold reward (the stand-in for human judgement).

    from rlhf.worlds import WorldConfig, build_world
    world = build_world(WorldConfig(seed=0))
    world.write("runs/demo/world")

See `rlhf.worlds.world` for the World API, `rlhf.worlds.gold` for the gold reward and
`rlhf.worlds.metrics` for the diagnostics the monitors use.
"""

from rlhf.worlds import metrics
from rlhf.worlds.config import WorldConfig, WorldConfigError
from rlhf.worlds.gold import GoldReward, GoldWeights, gold_reward
from rlhf.worlds.world import World, build_world, gold_weights, load_world

__all__ = [
    "GoldReward",
    "GoldWeights",
    "World",
    "WorldConfig",
    "WorldConfigError",
    "build_world",
    "gold_reward",
    "gold_weights",
    "load_world",
    "metrics",
]
