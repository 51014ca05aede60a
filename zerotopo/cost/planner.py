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
from dataclasses import dataclass, field, replace

from zerotopo.cost.bandwidth import BandwidthTable, default_table
from zerotopo.cost.comm import CollectiveCost, bytes_by_tier, grad_width, schedule_of
from zerotopo.cost.memory import GIB, MemoryBreakdown, _memory, max_model_params
from zerotopo.cost.presets import COST_PRESETS, resolve
from zerotopo.cost.time import OverlapModel, StepTime, collective_time, step_time
from zerotopo.errors import PlanError
from zerotopo.models.shape import ModelShape
from zerotopo.plan import PRESETS, Degrees, Plan, enumerate_plans
from zerotopo.spec.schedule import ScheduleOptions, StepSchedule, engine_units, module_units
from zerotopo.topology import Topology

#: Lins-style plans added to the presets by ``plans="auto"``.
AUTO_TOP = 5
#: Step times this close (relative) count as a tie in the recommendation; the smaller plan wins.
TIE = 0.005


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
    grad_bytes: int | None = None
    """Width of the accumulated gradient shard; None: the plan's ``grad_dtype`` (fp32: 4, param: 2)."""
    reduce_bytes: int | None = None
    """Width of the per-micro-batch gradient reduce-scatter; None: the plan's ``grad_dtype``."""
    grad_dtype: str | None = None
    """``param`` or ``fp32`` for plans that leave ``grad_dtype`` unset (``zerotopo plan`` passes a NeoX
    config's default, ``NeoXArgs.grad_dtype``: DeepSpeed's, the model dtype); a plan's own wins."""
    optim_bytes_per_param: int = 12
    """fp32 master + Adam m, v."""
    fp16: bool = False
    """fp16 adds a world all-reduce of the overflow flag each step."""
    memory_limit_bytes: float | None = None
    """Device memory budget; the topology's device memory when None."""
    bandwidth: BandwidthTable | None = None
    """Measured bandwidth curves; None: the topology's shipped table (``default_bandwidth``)."""
    default_bandwidth: bool = True
    """Use ``topologies/bandwidth/<topology>.yaml`` when ``bandwidth`` is None (False: alpha-beta only)."""
    overlap: OverlapModel = field(default_factory=OverlapModel)
    """Overlap parameters (compute slowdown, concurrent collectives, step-end overlap)."""
    unit_layers: tuple[int, ...] = (1,)
    """Layers per unit the planner may choose from for engine plans (the engine runs 1; larger units
    send larger messages and hold larger buffers). Each plan keeps its fastest fitting choice."""

    def table(self, topology: Topology) -> BandwidthTable | None:
        if self.bandwidth is not None:
            return self.bandwidth
        return default_table(topology.name) if self.default_bandwidth else None


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
    schedule: StepSchedule | None = field(default=None, repr=False, compare=False)
    """The per-unit schedule that was costed."""
    max_params: float = 0.0
    """The largest parameter count whose model states fit the device memory under this plan
    (:func:`~zerotopo.cost.memory.max_model_params`: no buffers or activations, as papers/003 §I counts)."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def unit_layers(self) -> int | None:
        """Layers per unit of the schedule costed (None for DeepSpeed's per-module schedule)."""
        if self.schedule is None or self.schedule.options.granularity != "unit":
            return None
        return self.schedule.options.unit_layers

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
            "unit_layers": self.unit_layers,
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


def _prepare(
    plan: Plan,
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    degrees: Degrees | None,
    unit_layers: int | None = None,
    schedule: ScheduleOptions | None = None,
):
    """Everything but the step time: (plan, degrees, memory, step schedule, fits); ``schedule`` as in
    :func:`estimate`."""
    plan, sched = resolve(plan)
    sched = schedule or sched
    if unit_layers is not None and sched.granularity == "unit":
        sched = replace(sched, unit_layers=unit_layers)
    if plan.grad_dtype is None and options.grad_dtype is not None:
        plan = replace(plan, grad_dtype=options.grad_dtype)
    d = degrees or plan.degrees(topology)
    o = options
    units = (
        module_units(shape, sched.persistence_threshold)
        if sched.granularity == "module"
        else engine_units(shape, sched.unit_layers)
    )
    gw = grad_width(plan, o.param_bytes)
    grad_bytes = gw if o.grad_bytes is None else o.grad_bytes
    reduce_bytes = gw if o.reduce_bytes is None else o.reduce_bytes
    # the internal forms take the resolved degrees: the planner resolves each plan once
    memory = _memory(
        [u.numel for u in units],
        plan,
        d,
        o.param_bytes,
        grad_bytes,
        o.optim_bytes_per_param,
        True,
        o.micro_batch,
        shape,
        o.checkpoint_activations,
    )
    limit = options.memory_limit_bytes
    if limit is None:
        limit = topology.device.memory_gib * GIB
    steps = schedule_of(
        [],
        topology,
        plan,
        micro_batches=o.grad_accum,
        param_bytes=o.param_bytes,
        reduce_bytes=reduce_bytes,
        grad_shard_bytes=grad_bytes,
        fp16=o.fp16,
        options=sched,
        degrees=d,
        units=units,
    )
    return plan, d, memory, steps, memory.total <= limit


def _finish(prepared, shape: ModelShape, topology: Topology, options: CostOptions) -> PlanEstimate:
    plan, d, memory, schedule, fits = prepared
    o = options
    comm = schedule.collectives()
    t = step_time(
        schedule,
        topology,
        shape,
        micro_batch=o.micro_batch,
        efficiency=o.efficiency,
        checkpoint_activations=o.checkpoint_activations,
        table=o.table(topology),
        overlap=o.overlap,
    )
    limit = o.memory_limit_bytes if o.memory_limit_bytes is not None else topology.device.memory_gib * GIB
    grad_bytes = grad_width(plan, o.param_bytes) if o.grad_bytes is None else o.grad_bytes
    biggest = max_model_params(
        topology, plan, param_bytes=o.param_bytes, grad_bytes=grad_bytes,
        optim_bytes_per_param=o.optim_bytes_per_param, memory_bytes=limit,
    )  # fmt: skip
    return PlanEstimate(plan, d, memory, comm, bytes_by_tier(comm, topology), t, fits, schedule, biggest)


def estimate(
    plan: Plan,
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    *,
    degrees: Degrees | None = None,
    schedule: ScheduleOptions | None = None,
) -> PlanEstimate:
    """Memory, bytes per tier and step time of one plan (``degrees``: already resolved). A DeepSpeed
    cost preset (:mod:`zerotopo.cost.presets`) is costed on DeepSpeed's schedule, any other plan on the
    engine's; ``schedule`` replaces either (a framework run with other settings)."""
    sched = schedule or resolve(plan)[1]
    choices = options.unit_layers if sched.granularity == "unit" and schedule is None else (None,)
    out = [
        _finish(_prepare(plan, shape, topology, options, degrees, k, schedule), shape, topology, options)
        for k in choices
    ]
    return min(out, key=_sort_key)


def _lower_bound(
    schedule: StepSchedule, shape: ModelShape, topology: Topology, options: CostOptions
) -> float:
    """A step time no simulation of ``schedule`` can beat: every micro-batch lasts at least its compute,
    its gathers back to back and its reductions back to back (the first's parameter gathers and the
    last's cross-replica reductions spread over all, which no split beats; sharing links and slowdown
    only add), and the step end adds its collectives less what may
    hide."""
    o = options
    table = o.table(topology)
    M = schedule.micro_batches
    peak = topology.device.peak_tflops * 1e12
    flops = shape.step_flops(o.micro_batch * M, checkpoint_activations=o.checkpoint_activations)
    compute = flops / (peak * o.efficiency) / M if peak > 0 else 0.0
    seen: dict[int, float] = {}

    def total(colls) -> float:
        out = 0.0
        for c in colls:
            if id(c) not in seen:
                seen[id(c)] = collective_time(c, topology, table)
            out += seen[id(c)]
        return out

    g = sum(total(u.forward) + total(u.backward) for u in schedule.units)
    r = sum(total(u.reduce) for u in schedule.units)
    # the first micro-batch's parameter gathers and the last one's cross-replica reductions: on their
    # own stream, or queued with the reductions (c == 2) or all communication (c == 1)
    extra = sum(total(u.last_reduce) + total(u.first_forward) for u in schedule.units)
    c = o.overlap.concurrent
    comm = g + r if c == 1 else max(g, r)
    edge = g + r + extra / M if c == 1 else max(g, r + extra / M) if c == 2 else max(g, r, extra / M)
    end = total(schedule.step_end)
    bwd_share = 1 - 1 / (4.0 if o.checkpoint_activations else 3.0)
    return M * max(compute, comm, edge) + end - min(o.overlap.step_end_overlap * end, compute * bwd_share)


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
        chosen = [p if isinstance(p, Plan) else resolve(p)[0] for p in plans]
        return sorted((estimate(p, shape, topology, opts) for p in chosen), key=_sort_key)
    presets = _presets(topology)
    out = [estimate(p, shape, topology, opts) for p in presets]
    if plans == "presets":
        return sorted(out, key=_sort_key)
    taken = {placement(p, topology) for p in presets}
    prepared = []
    for p in enumerate_plans(topology):
        d = p.degrees(topology)
        if (
            in_search_space(p, topology, aligned=aligned, degrees=d)
            and placement(p, topology, d) not in taken
        ):
            prepared.extend(_prepare(p, shape, topology, opts, d, k) for k in opts.unit_layers)
    if plans == "all":
        best: dict[tuple, PlanEstimate] = {}
        for x in prepared:  # each plan with its best unit size
            e = _finish(x, shape, topology, opts)
            key = placement(e.plan, topology, e.degrees)
            if key not in best or _sort_key(e) < _sort_key(best[key]):
                best[key] = e
        return sorted(out + list(best.values()), key=_sort_key)
    # auto: the AUTO_TOP fastest fitting plans, simulating candidates in order of a lower bound on their
    # step time and stopping once the bound passes the AUTO_TOP-th best simulated time (exact)
    bounded = sorted(
        ((_lower_bound(x[3], shape, topology, opts), i, x) for i, x in enumerate(prepared) if x[4]),
        key=lambda t: (t[0], t[1]),
    )
    lins: list[PlanEstimate] = []
    for bound, _, x in bounded:
        if len(lins) >= AUTO_TOP and bound > lins[AUTO_TOP - 1].time.step_time_s:
            break
        e = _finish(x, shape, topology, opts)
        key = placement(e.plan, topology, e.degrees)
        same = [i for i, y in enumerate(lins) if placement(y.plan, topology, y.degrees) == key]
        if same and _sort_key(lins[same[0]]) <= _sort_key(e):
            continue  # the same plan with another unit size is already faster
        if same:
            lins.pop(same[0])
        lins.append(e)
        lins.sort(key=_sort_key)
    return sorted(out + lins[:AUTO_TOP], key=_sort_key)


def best_plan(estimates: list[PlanEstimate]) -> PlanEstimate | None:
    """The fastest plan that fits, or None."""
    fitting = [e for e in estimates if e.fits]
    return min(fitting, key=_sort_key) if fitting else None


def secondary_alternative(
    e: PlanEstimate, shape: ModelShape, topology: Topology, options: CostOptions
) -> tuple[PlanEstimate, str] | None:
    """When ``e``'s secondary partition spans more ranks than its primary and dropping it (re-gathering
    the backward weights from the primary) is no slower and needs less memory: that plan and why."""
    d = e.degrees
    if d.secondary is None or d.secondary <= d.params:
        return None
    alt = estimate(replace(e.plan, name=f"{e.plan.name}-nosec", secondary=None), shape, topology, options)
    if alt.time.step_time_s > e.time.step_time_s * 1.005 or alt.memory.total >= e.memory.total:
        return None

    def backward(x: PlanEstimate) -> tuple[float, str]:
        cs = [c for c in x.comm if c.phase == "backward"]
        return sum(c.total_bytes for c in cs) / 1e9, "/".join(sorted({c.tier for c in cs})) or "-"

    b_sec, t_sec = backward(e)
    b_alt, t_alt = backward(alt)
    why = (
        f"{e.name}: its {d.secondary}-rank {e.plan.secondary_dtype} secondary partition costs "
        f"{e.memory.secondary / GIB:.2f} GiB per device and saves nothing: the backward sends {b_sec:.2f} GB per "
        f"device over {t_sec} where re-gathering from the {d.params}-rank primary sends {b_alt:.2f} GB over "
        f"{t_alt}; {alt.plan.label(topology)} takes {alt.time.step_time_s:.3f} s (vs {e.time.step_time_s:.3f} s) "
        f"with {(e.memory.total - alt.memory.total) / GIB:.2f} GiB less"
    )
    return alt, why


def recommendation(
    estimates: list[PlanEstimate], shape: ModelShape, topology: Topology, options: CostOptions
) -> str:
    """The plan to use, with a one-line reason, and any secondary partition that costs memory for nothing."""
    lines = []
    cands = [e for e in estimates if e.fits]
    for e in list(cands):
        alt = secondary_alternative(e, shape, topology, options)
        if alt is not None:
            cands.append(alt[0])
            lines.append(alt[1])
    if not cands:
        return "no plan fits the device memory: use more nodes, a smaller micro-batch or activation checkpointing"
    # the DeepSpeed cost presets price another framework's schedule: recommend a plan the engine runs
    runnable = [c for c in cands if c.plan.name not in COST_PRESETS] or cands
    fastest = min(runnable, key=_sort_key)
    # plans within TIE of the fastest are as fast as the model can tell: take the one needing least memory
    near = [c for c in runnable if c.time.step_time_s <= fastest.time.step_time_s * (1 + TIE)]
    best = min(near, key=lambda c: (c.memory.total, c.time.step_time_s))
    runner = sorted((c for c in cands if c is not best and c.name != best.name), key=_sort_key)
    reason = (
        f"fastest plan that fits: {best.time.step_time_s:.3f} s per step, {best.memory.total / GIB:.1f} GiB per device"
        if best is fastest
        else f"within {100 * TIE:g}% of the fastest plan that fits ({best.time.step_time_s:.3f} s vs "
        f"{fastest.time.step_time_s:.3f} s per step) with the least memory, {best.memory.total / GIB:.1f} GiB per device"
    )
    if runner:
        r = runner[0]
        reason += f", {r.time.step_time_s / best.time.step_time_s:.2f}x the throughput of {r.name}"
    label = best.plan.label(topology)
    name = best.name if best.name == label else f"{best.name} ({label})"
    if best.unit_layers not in (None, 1):
        name += f" with {best.unit_layers} layers per unit"
    lines.insert(0, f"recommended: {name}: {reason}")
    return "\n".join(lines)
