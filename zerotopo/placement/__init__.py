"""The placement layer: what goes where, as pure Python (no process group, no tensors), so that every
plan is checked and costed on one process in milliseconds. It imports nothing of zerotopo but the
foundation modules (errors, resources); everything else builds on it (tests/test_layers.py).

- :mod:`~zerotopo.placement.topology`: the machine's tiers, bandwidths and topological indices;
- :mod:`~zerotopo.placement.plan`: one shard degree per model state, presets and the nesting rule;
- :mod:`~zerotopo.placement.layout`: which rank owns which chunk of a unit's flat buffer;
- :mod:`~zerotopo.placement.matrices`: whole-matrix owners inside an optimizer group (Muon);
- :mod:`~zerotopo.placement.architecture`: each architecture stated once (switches, modules, checkpoint names);
- :mod:`~zerotopo.placement.shape`: the model's unit description (parameters, shapes, FLOPs);
- :mod:`~zerotopo.placement.codecs` and :mod:`~zerotopo.placement.volume`: wire formats and the bytes each sends;
- :mod:`~zerotopo.placement.schedule`: per unit and micro-batch, the collectives around its compute, and the
  step-end collectives, which the engine executes and the cost model sums;
- :mod:`~zerotopo.placement.yamlio`: the strict YAML reader every config and topology file goes through.
"""

from zerotopo.placement.codecs import CODECS, Codec, get_codec
from zerotopo.placement.schedule import (
    ENGINE,
    Collective,
    ScheduleBuilder,
    ScheduleModel,
    ScheduleOptions,
    StepSchedule,
    Unit,
    UnitSteps,
    engine_unit_steps,
    engine_units,
    step_schedule,
    units_from_numels,
)

__all__ = [
    "CODECS",
    "ENGINE",
    "Codec",
    "Collective",
    "ScheduleBuilder",
    "ScheduleModel",
    "ScheduleOptions",
    "StepSchedule",
    "Unit",
    "UnitSteps",
    "engine_unit_steps",
    "engine_units",
    "get_codec",
    "step_schedule",
    "units_from_numels",
]
