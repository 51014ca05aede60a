"""What a training step does, as data: the per-unit collective schedule and the payload codecs.

- :mod:`~zerotopo.spec.codecs`: wire formats (fp32, bf16, int8, int4) and the bytes each sends.
- :mod:`~zerotopo.spec.schedule`: per unit and micro-batch, the collectives around its compute, and the
  step-end collectives; the cost model sums it.
"""

from zerotopo.spec.codecs import CODECS, Codec, get_codec
from zerotopo.spec.schedule import (
    ENGINE,
    Collective,
    ScheduleOptions,
    StepSchedule,
    Unit,
    UnitSteps,
    engine_unit_steps,
    engine_units,
    module_units,
    step_schedule,
    units_from_numels,
)

__all__ = [
    "CODECS",
    "ENGINE",
    "Codec",
    "Collective",
    "ScheduleOptions",
    "StepSchedule",
    "Unit",
    "UnitSteps",
    "engine_unit_steps",
    "engine_units",
    "get_codec",
    "module_units",
    "step_schedule",
    "units_from_numels",
]
