"""The sharding engine: units, hooks, event-ordered collectives and the sharded optimizer."""

from zerotopo.engine.api import Engine, ShardedModule, parallelize
from zerotopo.engine.optim import LossScaler, ShardedAdamW, ShardedOptimizer
from zerotopo.engine.streams import OrderingError
from zerotopo.engine.units import default_no_decay

__all__ = [
    "Engine",
    "LossScaler",
    "OrderingError",
    "ShardedAdamW",
    "ShardedOptimizer",
    "ShardedModule",
    "default_no_decay",
    "parallelize",
]
