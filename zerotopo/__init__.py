"""zerotopo: topology-aware sharded data-parallel training.

The layers, from the bottom up: :mod:`zerotopo.placement.topology` (the machine), :mod:`zerotopo.placement.plan` and
:mod:`zerotopo.placement.layout` (where each model state lives), :mod:`zerotopo.cost` (what a plan costs),
:mod:`zerotopo.comm` (process groups, collectives, quantization), :mod:`zerotopo.engine` (the sharded
training step) and :mod:`zerotopo.trainer` (NeoX models, data and the training loop).
"""

from __future__ import annotations

__version__ = "0.1.0"
