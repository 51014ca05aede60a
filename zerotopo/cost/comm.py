"""Bytes per step: every collective the engine issues for a plan, its group, the tier it crosses.

[Note: counted schedule] Per unit (embedding, each layer, head; ``n`` elements padded by
:func:`zerotopo.placement.layout.padded_numel`) and per micro-batch:

- forward: all-gather over the ``params`` group (int8 payload when the plan quantizes weights);
- backward: all-gather over the ``secondary`` group (bf16 or int8 payload) or, without a secondary
  partition, over the ``params`` group again; none for the last unit of the forward, which keeps its
  gathered weights for the backward that follows at once;
- gradient reduce-scatter over the ``grads`` group in the reduce dtype, or an int4 all-to-all (two hops,
  inside the node then across nodes, when the group spans nodes).

Once per step and unit: the cross-replica gradient reduction (``allreduce`` of the gradient shard over
``grad_replicas``, or ``reduce_scatter`` over ``optim_scatter`` then all-reduce over ``optim_replicas``)
and the all-gather of updated parameter chunks over ``param_gather``; once per step: a scalar all-reduce
over the ``optim`` group for the gradient norm (and one over the world for the fp16 overflow check).

The schedule itself is data, built once in :mod:`zerotopo.placement.schedule` (per unit and micro-batch); this
module merges it into counts. All byte counts come from :mod:`zerotopo.placement.volume`, the functions the
runtime ledger uses, so the two agree byte for byte. A collective over a group of one rank moves nothing
and is not listed.
"""

from __future__ import annotations

from typing import Any

from zerotopo.placement.plan import Degrees, Plan
from zerotopo.placement.schedule import (
    ENGINE,
    MICRO_BATCH_PHASES,
    PHASES,
    ScheduleModel,
    StepSchedule,
    group_tier,
    step_schedule,
    units_from_numels,
)
from zerotopo.placement.schedule import Collective as CollectiveCost
from zerotopo.placement.topology import Topology

__all__ = [
    "MICRO_BATCH_PHASES",
    "PHASES",
    "CollectiveCost",
    "bytes_by_op_tier",
    "bytes_by_tier",
    "comm_per_step",
    "edge_costs",
    "group_tier",
    "intra_inter_bytes",
]

#: Op names as the runtime ledger records them (zerotopo.comm.collectives / qcollectives).
INT8_AG = "all_gather_int8"
INT4_RS = "reduce_scatter_int4"


def comm_per_step(
    unit_numels: list[int], topology: Topology, plan: Plan, **kwargs: Any
) -> list[CollectiveCost]:
    """Every collective of one training step (see the module note): :func:`schedule_of`'s schedule with
    its keywords (``micro_batches``, required; ``param_bytes``, ``reduce_bytes``, ``grad_shard_bytes``,
    ``padded``, ``fp16``), identical collectives merged (``count`` says how many run per step).

    ``param_bytes`` is the width of the gathered weights, ``reduce_bytes`` that of the per-micro-batch
    gradient reduce-scatter and ``grad_shard_bytes`` that of the accumulated gradient shard reduced once
    per step; both follow ``plan.grad_dtype`` when not given (``fp32``: 4 bytes, the engine's default;
    ``param``: ``param_bytes``, as DeepSpeed and the papers' fp16 tables). With ``padded=False`` units are
    not padded, so every count must split evenly over the groups (as the papers' closed forms assume).
    """
    return schedule_of(unit_numels, topology, plan, **kwargs).collectives()


def grad_width(plan: Plan, param_bytes: int) -> int:
    """Bytes per gradient element the plan reduces and accumulates (``plan.grad_dtype``)."""
    return param_bytes if getattr(plan, "grad_dtype", "fp32") == "param" else 4


def schedule_of(
    unit_numels: list[int],
    topology: Topology,
    plan: Plan,
    *,
    micro_batches: int,
    param_bytes: int = 2,
    reduce_bytes: int | None = None,
    grad_shard_bytes: int | None = None,
    padded: bool = True,
    fp16: bool = False,
    options: ScheduleModel = ENGINE,
    degrees: Degrees | None = None,
    units=None,
    shared: dict | None = None,
) -> StepSchedule:
    """The per-unit :class:`~zerotopo.placement.schedule.StepSchedule` :func:`comm_per_step` merges
    (``shared``: as in :func:`~zerotopo.placement.schedule.step_schedule`)."""
    gw = grad_width(plan, param_bytes)
    return step_schedule(
        units if units is not None else units_from_numels(unit_numels),
        topology,
        plan,
        micro_batches=micro_batches,
        param_bytes=param_bytes,
        reduce_bytes=gw if reduce_bytes is None else reduce_bytes,
        grad_shard_bytes=gw if grad_shard_bytes is None else grad_shard_bytes,
        padded=padded,
        fp16=fp16,
        options=options,
        degrees=degrees,
        shared=shared,
    )


def edge_costs(unit_numels: list[int], topology: Topology, plan: Plan, **kwargs) -> list[CollectiveCost]:
    """The first forward unit's collectives for one micro-batch: its forward all-gather opens the step
    and its gradient reduce-scatter closes the backward, so neither overlaps compute."""
    kwargs["micro_batches"] = 1
    one = comm_per_step(unit_numels[:1], topology, plan, **kwargs)
    return [c for c in one if c.phase in ("forward", "grad_reduce")]


def bytes_by_tier(costs: list[CollectiveCost], topology: Topology | None = None) -> dict[str, int]:
    """Bytes one rank sends per step, per tier crossed (every tier of ``topology`` listed, zeros too)."""
    out: dict[str, int] = dict.fromkeys(topology.tier_names, 0) if topology is not None else {}
    for c in costs:
        out[c.tier] = out.get(c.tier, 0) + c.total_bytes
    return out


def bytes_by_op_tier(costs: list[CollectiveCost]) -> dict[tuple[str, str], int]:
    """Bytes one rank sends per step per ``(op, tier)``: the key the runtime ledger is compared on."""
    out: dict[tuple[str, str], int] = {}
    for c in costs:
        out[(c.op, c.tier)] = out.get((c.op, c.tier), 0) + c.total_bytes
    return out


def intra_inter_bytes(costs: list[CollectiveCost], topology: Topology) -> tuple[int, int]:
    """(bytes inside a node, bytes across nodes) one rank sends per step."""
    by = bytes_by_tier(costs, topology)
    inter = by.get(topology.network.name, 0)
    return sum(by.values()) - inter, inter
