"""The planner: cost every candidate plan for a model on a machine and rank those that fit.

Candidates are the presets and/or every valid Lins-style plan of :func:`zerotopo.plan.enumerate_plans`.
The search space is pre-filtered (:func:`in_search_space`): by default only *tier-aligned* degrees
(papers/004 §V-B, Eq. 5-7: a degree either divides each tier's size or is a multiple of it, so every
group is whole packages, whole nodes or whole sets of nodes; ``aligned=False`` searches every divisor of
the world), and a secondary partition only over at most the primary's group (hpZ's use of it: keep the
backward gather inside a tier the forward gather crosses). The presets are always costed. Each
candidate gets its memory per device, its bytes per tier and its predicted step time; plans over the
device memory are kept but marked, and the list is sorted fits first, then by step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from zerotopo.cost.comm import CollectiveCost, _comm, _edge, bytes_by_tier
from zerotopo.cost.memory import GIB, MemoryBreakdown, _memory, grad_widths
from zerotopo.cost.time import StepTime, step_time
from zerotopo.errors import PlanError
from zerotopo.models.shape import ModelShape
from zerotopo.plan import PRESETS, Degrees, Plan, enumerate_plans, get_preset
from zerotopo.topology import Topology

#: Lins-style plans added to the presets by ``plans="auto"``.
AUTO_TOP = 5


@dataclass(frozen=True)
class CostOptions:
    """Precision and training settings shared by every candidate."""

    micro_batch: int = 1
    """Samples per micro-batch per device."""
    grad_accum: int = 1
    """Micro-batches per step (``M``)."""
    efficiency: float = 0.5
    """Fraction of peak FLOPS the compute reaches."""
    checkpoint_activations: bool = True
    """Recompute activations in the backward (NeoX ``checkpoint_activations``)."""
    param_bytes: int = 2
    """Width of the trainable parameters and of their all-gather (bf16/fp16)."""
    grad_bytes: int = 4
    """Width of the accumulated gradient shard when neither the plan nor ``grad_dtype`` sets it."""
    reduce_bytes: int = 4
    """Width of the per-micro-batch gradient reduce-scatter (likewise)."""
    grad_dtype: str | None = None
    """``param`` or ``fp32`` for plans that leave ``grad_dtype`` unset (a NeoX config's default,
    ``NeoXArgs.grad_dtype``); a plan's own ``grad_dtype`` wins (:func:`~zerotopo.cost.memory.grad_widths`)."""
    optim_bytes_per_param: int = 12
    """fp32 master + Adam m, v."""
    fp16: bool = False
    """fp16 adds a world all-reduce of the overflow flag each step."""
    memory_limit_bytes: float | None = None
    """Device memory budget; the topology's device memory when None."""


@dataclass(frozen=True)
class PlanEstimate:
    """One costed candidate."""

    plan: Plan
    degrees: Degrees
    memory: MemoryBreakdown
    comm: list[CollectiveCost] = field(repr=False)
    comm_bytes: dict[str, int]
    """Bytes one rank sends per step, per tier (every tier of the topology listed)."""
    time: StepTime
    fits: bool
    max_params: float = 0.0
    """The largest parameter count whose model states (parameters, secondary, gradients, optimizer; no
    buffers or activations, as papers/003 §II counts) fit the device memory under this plan."""

    @property
    def name(self) -> str:
        return self.plan.name

    def to_json(self, topology: Topology) -> dict:
        m = self.memory
        return {
            "name": self.plan.name,
            "degrees": self.plan.label(topology),
            "memory_bytes": {
                "params": m.params,
                "secondary": m.secondary,
                "grads": m.grads,
                "optim": m.optim,
                "buffers": m.buffers,
                "activations": m.activations,
                "total": m.total,
            },
            "comm_bytes": dict(self.comm_bytes),
            "step_time_s": self.time.step_time_s,
            "tokens_per_s": self.time.tokens_per_s,
            "tflops_per_device": self.time.tflops_per_device,
            "mfu": self.time.mfu,
            "fits": self.fits,
            "max_params": self.max_params,
        }


def is_tier_aligned(degree: int, topology: Topology) -> bool:
    """Whether groups of ``degree`` consecutive indices are whole instances of tiers (or sets of them)."""
    size = 1
    for t in topology.tiers:
        size *= t.fanout
        if size % degree and degree % size:
            return False
    return True


def in_search_space(
    plan: Plan, topology: Topology, *, aligned: bool = True, degrees: Degrees | None = None
) -> bool:
    """The planner's pre-filter (as Lins' Pre-Filter, papers/004 §V-A) on a valid plan.

    Kept: tier-aligned degrees (unless ``aligned=False``) and secondary partitions over at most the
    primary's group. A secondary over more ranks than the primary holds more than the primary's shard
    (bf16) or a large share of it (int8) and makes the backward gather cross a wider tier than a gather
    from the primary would, so such candidates are rarely worth costing. The presets (zerotopo's
    node-wide int8 secondary over package-wide weights among them) are always costed.
    """
    d = degrees or plan.degrees(topology)
    if d.secondary is not None and d.secondary > d.params:
        return False
    return not aligned or all(
        is_tier_aligned(x, topology) for x in (d.params, d.grads, d.optim, d.secondary or 1)
    )


def estimate(
    plan: Plan, shape: ModelShape, topology: Topology, options: CostOptions, *, degrees: Degrees | None = None
) -> PlanEstimate:
    """Memory, bytes per tier and step time of one plan (``degrees``: already resolved)."""
    units = shape.unit_params()
    d = degrees or plan.degrees(topology)
    o = options
    gb, rb = grad_widths(
        plan, o.param_bytes, o.grad_dtype, grad_bytes=o.grad_bytes, reduce_bytes=o.reduce_bytes
    )
    # the internal forms take the resolved degrees: the planner resolves each plan once
    memory = _memory(
        units, plan, d, o.param_bytes, gb, o.optim_bytes_per_param, True, o.micro_batch, shape,
        o.checkpoint_activations,
    )  # fmt: skip
    comm = _comm(units, topology, plan, d, o.grad_accum, o.param_bytes, rb, gb, True, o.fp16)
    t = step_time(
        comm,
        topology,
        shape,
        micro_batch=options.micro_batch,
        micro_batches=options.grad_accum,
        prefetch=plan.prefetch,
        efficiency=options.efficiency,
        checkpoint_activations=options.checkpoint_activations,
        edge=_edge(units, topology, plan, d, o.param_bytes, rb, o.fp16, gb),
    )
    limit = options.memory_limit_bytes
    if limit is None:
        limit = topology.device.memory_gib * GIB
    # model states are linear in the parameter count: cost one unpadded unit of 10^9 and scale
    per_param = (
        _memory(
            [10**9], plan, d, o.param_bytes, gb, o.optim_bytes_per_param, False, 1, None, False
        ).model_states
        / 10**9
    )
    return PlanEstimate(
        plan, d, memory, comm, bytes_by_tier(comm, topology), t, memory.total <= limit, limit / per_param
    )


def placement(plan: Plan, topology: Topology, degrees: Degrees | None = None) -> tuple:
    """What decides a plan's cost: resolved degrees, secondary dtype, quantization (not its name)."""
    d = degrees or plan.degrees(topology)
    dtype = plan.secondary_dtype if d.secondary is not None else None
    return (
        d,
        dtype,
        plan.quantize_weights,
        plan.quantize_grads,
        plan.quant_block,
        plan.prefetch,
        plan.grad_reduce,
        plan.grad_dtype,
    )


def _presets(topology: Topology) -> list[Plan]:
    out: dict[tuple, Plan] = {}
    for plan in PRESETS.values():
        try:
            key = placement(plan, topology)
        except PlanError:
            continue  # e.g. a node-sized preset on a topology smaller than a node
        out.setdefault(key, plan)  # hsdp is mics under another name: list it once
    return list(out.values())


def _sort_key(e: PlanEstimate) -> tuple:
    return (not e.fits, e.time.step_time_s, e.memory.total, e.plan.name)


def plan_candidates(
    shape: ModelShape,
    topology: Topology,
    *,
    micro_batch: int = 1,
    grad_accum: int = 1,
    plans: str | Sequence[str | Plan] = "auto",
    aligned: bool = True,
    options: CostOptions | None = None,
    **option_kwargs,
) -> list[PlanEstimate]:
    """Cost the candidate plans and sort them: fitting plans first, fastest first.

    ``plans``: ``"all"`` (every valid plan: presets and Lins-style degrees), ``"auto"`` (the presets plus
    the :data:`AUTO_TOP` fastest fitting Lins-style plans), ``"presets"``, or a list of preset names /
    :class:`Plan` objects. Other keyword arguments are :class:`CostOptions` fields.
    """
    opts = options or CostOptions(micro_batch=micro_batch, grad_accum=grad_accum, **option_kwargs)
    if isinstance(plans, str) and plans not in ("all", "auto", "presets"):
        plans = [p for p in plans.split(",") if p.strip()]
    if not isinstance(plans, str):
        chosen = [p if isinstance(p, Plan) else get_preset(p) for p in plans]
        return sorted((estimate(p, shape, topology, opts) for p in chosen), key=_sort_key)
    presets = _presets(topology)
    out = [estimate(p, shape, topology, opts) for p in presets]
    if plans == "presets":
        return sorted(out, key=_sort_key)
    taken = {placement(p, topology) for p in presets}
    lins = []
    for p in enumerate_plans(topology):
        d = p.degrees(topology)
        if (
            in_search_space(p, topology, aligned=aligned, degrees=d)
            and placement(p, topology, d) not in taken
        ):
            lins.append(estimate(p, shape, topology, opts, degrees=d))
    lins.sort(key=_sort_key)
    if plans == "auto":
        lins = [e for e in lins if e.fits][:AUTO_TOP]
    return sorted(out + lins, key=_sort_key)


def best_plan(estimates: list[PlanEstimate]) -> PlanEstimate | None:
    """The fastest plan that fits, or None."""
    fitting = [e for e in estimates if e.fits]
    return min(fitting, key=_sort_key) if fitting else None
