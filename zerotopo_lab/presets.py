"""Cost-model presets that describe DeepSpeed's own schedule, so the papers' comparisons can be simulated.

Xu et al. (arXiv:2501.04266) ran ZeRO-3 and ZeRO++ in DeepSpeed 0.13.1 (its Table IX) with fp16 and
``overlap_comm``;
zerotopo's engine runs the same placements with a different schedule (one flat buffer per layer). These
presets keep the placement of the ``zero3`` and ``zeropp`` plans and replace the schedule by DeepSpeed's,
at its defaults (``deepspeed/runtime/zero/config.py``, unchanged from 0.13 to 0.19):

- one all-gather per submodule's parameters (QKV, attention output, the two MLP matrices, embedding,
  head), not per layer; parameters under ``stage3_param_persistence_threshold`` = 1e5 elements
  (biases, LayerNorms) stay whole on every rank and are never gathered;
- prefetch while fewer than ``stage3_prefetch_bucket_size`` = 5e7 elements are in flight;
- gradients reduced in buckets of ``reduce_bucket_size`` = 5e8 elements, in fp16 (``grad_dtype:
  param``), on a side stream (``overlap_comm``); ``allgather_bucket_size`` (5e8) only concerns ZeRO-1/2;
- ZeRO++ (``zero_hpz_partition_size: 8``, ``zero_quantized_weights``, ``zero_quantized_gradients``):
  int8 forward gathers over the job, the fp16 hpZ copy per node for the backward, int4 hierarchical
  all-to-all gradient reduction.

Lins (Chen et al., IWQoS 2024) compared against DeepSpeed's ZeRO-1 and MiCS (its §VI-A, ``overlap_comm`` on):

- ZeRO-1/2 (``deepspeed/runtime/zero/stage_1_and_2.py``): with ``overlap_comm`` the backward hooks reduce
  the gradients at the accumulation boundary in buckets of ``reduce_bucket_size`` on a side stream; a
  bucket is all-reduced over the data-parallel group (``use_multi_rank_bucket_allreduce``, on by
  default in the installed DeepSpeed, checked by a test; Lins (Chen et al., IWQoS 2024) does not give its
  version) and each
  rank keeps its partition; after the optimizer the updated partitions are all-gathered at the step end
  in calls of ``allgather_bucket_size`` = 5e8 elements, which never overlap compute (DeepSpeed issue
  #3338);
- MiCS (``deepspeed/runtime/zero/mics.py``, added in DeepSpeed 0.9, gone from the installed one): the
  stage-3 schedule inside the shard group (a node), and at the accumulation boundary each reduce
  bucket's shard is all-reduced across the replica groups right after its reduce-scatter, on the same
  stream (``allreduce_mics_shard_grads``).

Xu et al.'s own design ran on the same DeepSpeed: ``deepspeed-zerotopo`` is the ``zerotopo`` placement
(weights over a package's 2 GCDs with an int8 secondary per node, gradients per node, optimizer states
over the job) on DeepSpeed's per-module stage-3 schedule, its cross-node gradient reduction an all-reduce
of the node's gradient shard followed by select-and-drop (``grad_reduce: allreduce``), as Xu et al.
(arXiv:2501.04266) §IV
describes it ("after accumulating all mini-batch gradients ... we call Allreduce on local gradients
stored among nodes before performing weight updates"): at the accumulation boundary, each reduce
bucket's shard all-reduced across nodes after its reduce-scatter, as DeepSpeed's MiCS does
(:data:`DEEPSPEED_MICS`).

DeepSpeed stage 3 also has fixed costs per module that the bytes do not show (:data:`DEEPSPEED_RUNTIME`,
:class:`zerotopo.cost.time.RuntimeCosts`):

- host work per module per step: ``DS_ACCELERATOR=cpu python benchmarks/deepspeed_host_cost.py
  --modules 32,128,256`` (DeepSpeed 0.19.8, one rank, compute-free ``Linear(64, 64)`` stacks) measured
  what stage 3 adds over stage 0 at 621, 499 and 426 µs per module per step on a 2-core VM
  (docs/cost-model.md); the largest stack's figure, 426 µs, is the default (a datacenter host is
  faster, so it bounds the host's share from above);
- the fetch window: ``PartitionedParameterCoordinator`` keeps at most ``__max_ongoing_fetch_events = 2``
  fetch events outstanding and synchronizes the host on the oldest beyond them
  (``deepspeed/runtime/zero/partitioned_param_coordinator.py``), so no more than 2 modules are
  prefetched ahead whatever the prefetch bucket allows;
- ZeRO++'s quantized gather (``zero_quantized_weights``) all-gathers the int8 codes and then their fp32
  scales in a second call.

They are cost-model presets (``zerotopo plan --plans deepspeed-zero3,deepspeed-zeropp``): the engine runs
the ``zero3``/``zeropp``/``zero1``/``mics``/``zerotopo`` plans with its own schedule.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from zerotopo.cost import planner
from zerotopo.cost.planner import CostOptions
from zerotopo.cost.time import RuntimeCosts
from zerotopo.errors import ConfigError
from zerotopo.placement.plan import PRESETS, Plan, get_preset
from zerotopo.placement.schedule import ENGINE, ScheduleModel
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology
from zerotopo_lab.deepspeed_schedule import (
    DEEPSPEED_RUNTIME,
    DS_FETCH_WINDOW,
    DS_HOST_S_PER_MODULE,
    DeepSpeedSchedule,
)

__all__ = [
    "COST_PRESETS",
    "DEEPSPEED",
    "DEEPSPEED_MICS",
    "DEEPSPEED_RUNTIME",
    "DEEPSPEED_ZERO12",
    "DS_ALLGATHER_BUCKET",
    "DS_FETCH_WINDOW",
    "DS_HOST_S_PER_MODULE",
    "DS_PERSISTENCE_THRESHOLD",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "estimate",
    "plan_candidates",
    "priced",
    "resolve",
    "runtime_costs",
]

#: DeepSpeed's defaults (elements), deepspeed/runtime/zero/config.py.
DS_REDUCE_BUCKET = 500_000_000
DS_ALLGATHER_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000
DS_PERSISTENCE_THRESHOLD = 100_000

DEEPSPEED = DeepSpeedSchedule(
    name="deepspeed",
    reduce_bucket_elems=DS_REDUCE_BUCKET,
    prefetch_bucket_elems=DS_PREFETCH_BUCKET,
    persistence_threshold=DS_PERSISTENCE_THRESHOLD,
    step_end_in_backward=False,
    param_gather_in_forward=False,
    secondary_param_dtype=True,
    description="DeepSpeed ZeRO-3 stage-3 defaults: per-module gathers, 5e7 prefetch, 5e8 reduce buckets",
)

#: DeepSpeed ZeRO-1/2 with ``overlap_comm``: bucketed reductions in the boundary backward, bucketed
#: parameter all-gathers at the step end (no parameter gathers in the micro-batches).
DEEPSPEED_ZERO12 = replace(
    DEEPSPEED,
    name="deepspeed-zero12",
    prefetch_bucket_elems=None,
    persistence_threshold=0,
    step_end_in_backward=True,
    allgather_bucket_elems=DS_ALLGATHER_BUCKET,
    description="DeepSpeed ZeRO-1/2 defaults: 5e8 all-reduce buckets in the boundary backward, 5e8 "
    "all-gather buckets after the step",
)

#: DeepSpeed MiCS: the stage-3 schedule in the shard group, each bucket all-reduced across replicas in
#: the boundary backward.
DEEPSPEED_MICS = replace(
    DEEPSPEED,
    name="deepspeed-mics",
    step_end_in_backward=True,
    description="DeepSpeed MiCS: stage-3 defaults in the shard group, each reduce bucket all-reduced "
    "across replicas in the boundary backward",
)

COST_PRESETS: dict[str, tuple[Plan, DeepSpeedSchedule]] = {
    "deepspeed-zero3": (
        replace(
            PRESETS["zero3"],
            name="deepspeed-zero3",
            grad_dtype="param",
            description="DeepSpeed ZeRO-3 as Xu et al. ran it: per-module gathers, fp16 gradient buckets",
        ),
        DEEPSPEED,
    ),
    "deepspeed-zeropp": (
        replace(
            PRESETS["zeropp"],
            name="deepspeed-zeropp",
            grad_dtype="param",
            description="DeepSpeed ZeRO++ (hpZ per node, qwZ int8, qgZ int4) with DeepSpeed's schedule",
        ),
        DEEPSPEED,
    ),
    "deepspeed-zero1": (
        replace(
            PRESETS["zero1"],
            name="deepspeed-zero1",
            grad_dtype="param",
            grad_reduce="allreduce",
            description="DeepSpeed ZeRO-1 (overlap_comm): bucketed gradient all-reduce in the backward, "
            "bucketed parameter all-gather after the step",
        ),
        DEEPSPEED_ZERO12,
    ),
    "deepspeed-zerotopo": (
        replace(
            PRESETS["zerotopo"],
            name="deepspeed-zerotopo",
            grad_dtype="param",
            grad_reduce="allreduce",
            description="Xu et al. as it ran: weights on 2 GCDs (int8 secondary per node), gradients per "
            "node all-reduced across nodes per reduce bucket then select-and-drop, optimizer over the job, "
            "on DeepSpeed's per-module schedule",
        ),
        DEEPSPEED_MICS,
    ),
    "deepspeed-mics": (
        replace(
            PRESETS["mics"],
            name="deepspeed-mics",
            grad_dtype="param",
            description="DeepSpeed MiCS (shard group = node) with DeepSpeed's stage-3 schedule",
        ),
        DEEPSPEED_MICS,
    ),
}


def resolve(spec: str | Plan) -> tuple[Plan, ScheduleModel]:
    """A plan and the schedule the cost model gives it: a cost preset, or a plan run by the engine."""
    if isinstance(spec, Plan):
        if spec.name in COST_PRESETS and spec == COST_PRESETS[spec.name][0]:
            return COST_PRESETS[spec.name]
        return spec, ENGINE
    key = spec.strip().lower().replace("_", "-")
    if key in COST_PRESETS:
        return COST_PRESETS[key]
    try:
        return get_preset(spec), ENGINE
    except ConfigError as exc:
        raise ConfigError(
            f"unknown plan preset {spec!r}; presets are {', '.join(PRESETS)}, and for the cost model "
            f"{', '.join(COST_PRESETS)}",
            key="plan",
        ) from exc


def runtime_costs(options: ScheduleModel) -> RuntimeCosts:
    """The fixed runtime costs of the framework a schedule describes: DeepSpeed stage 3's for the
    per-module schedules that fetch (:data:`DEEPSPEED_RUNTIME`), none for the engine's and for ZeRO-1/2."""
    return options.runtime or RuntimeCosts()


def priced(spec: str | Plan) -> Plan | tuple[Plan, ScheduleModel]:
    """What the planner takes for ``spec``: a cost preset as its ``(Plan, schedule)`` pair, any other plan
    alone (the planner prices it on the engine's schedule)."""
    plan, sched = resolve(spec)
    return (plan, sched) if sched is not ENGINE else plan


def estimate(spec: str | Plan, shape: ModelShape, topology: Topology, options: CostOptions, **kwargs: Any):
    """:func:`zerotopo.cost.planner.estimate` of ``spec`` on its own schedule: a cost preset's (by name or
    plan) on DeepSpeed's, any other plan on the engine's."""
    plan, sched = resolve(spec)
    if sched is not ENGINE:
        kwargs.setdefault("schedule", sched)
    return planner.estimate(plan, shape, topology, options, **kwargs)


def plan_candidates(shape: ModelShape, topology: Topology, *, plans: Any = "auto", **kwargs: Any) -> list:
    """:func:`zerotopo.cost.planner.plan_candidates` with the cost presets among the named ``plans``."""
    if not isinstance(plans, str) or plans not in ("all", "auto", "presets"):
        names = plans.split(",") if isinstance(plans, str) else plans
        plans = [priced(p) for p in names if not isinstance(p, str) or p.strip()]
    return planner.plan_candidates(shape, topology, plans=plans, **kwargs)
