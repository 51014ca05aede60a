"""The sharding engine: units, hooks, event-ordered collectives and the sharded optimizer."""

from zerotopo.engine.api import MixedPrecision, ShardedModule, parallelize
from zerotopo.engine.optim import LossScaler, ShardedOptimizer
from zerotopo.engine.streams import OrderingError
from zerotopo.engine.units import default_no_decay

__all__ = [
    "LossScaler",
    "MixedPrecision",
    "OrderingError",
    "ShardedModule",
    "ShardedOptimizer",
    "default_no_decay",
    "parallelize",
]
