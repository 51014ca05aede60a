"""The schedule the cost model prices a plan with: the engine's (:data:`~zerotopo.placement.schedule.ENGINE`)
for every plan the engine runs.

Another framework's schedule (DeepSpeed's, in the lab's ``zerotopo_lab.presets``) is given to the planner
with its plan, as a ``(Plan, ScheduleModel)`` pair (:func:`zerotopo.cost.planner.plan_candidates`) or as
``estimate(..., schedule=...)``; the library knows no framework but its own.
"""

from __future__ import annotations

from zerotopo.cost.time import RuntimeCosts
from zerotopo.errors import ConfigError
from zerotopo.placement.plan import PRESETS, Plan, get_preset
from zerotopo.placement.schedule import ENGINE, ScheduleModel

#: How to get the other frameworks' cost presets (``deepspeed-zero3`` ...), named in errors.
LAB_INSTALL = "pip install 'zerotopo[lab]'"


def resolve(spec: str | Plan) -> tuple[Plan, ScheduleModel]:
    """A plan and the schedule the cost model gives it: the engine's."""
    if isinstance(spec, Plan):
        return spec, ENGINE
    try:
        return get_preset(spec), ENGINE
    except ConfigError as exc:
        hint = ""
        if spec.strip().lower().startswith(("deepspeed", "fsdp")):
            hint = (
                f"; other frameworks' cost presets come with the lab (zerotopo_lab: {LAB_INSTALL}), "
                "through `zerotopo plan --plans` or zerotopo_lab.presets"
            )
        raise ConfigError(
            f"unknown plan preset {spec!r}; presets are {', '.join(PRESETS)}{hint}", key="plan"
        ) from exc


def runtime_costs(options: ScheduleModel) -> RuntimeCosts:
    """The fixed runtime costs of the framework a schedule describes (none for the engine's)."""
    return options.runtime or RuntimeCosts()
