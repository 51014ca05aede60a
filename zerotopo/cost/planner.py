"""The planner: cost every candidate plan for a model on a machine and rank those that fit.

Candidates are the presets and/or every valid Lins-style plan of :func:`zerotopo.placement.plan.enumerate_plans`.
The search space is pre-filtered (:func:`in_search_space`): by default only *tier-aligned* degrees
(Chen et al., "Lins: Reducing Communication Overhead of ZeRO for Efficient LLM Training" (IWQoS 2024,
doi:10.1109/IWQoS61813.2024.10682856) §V-B, Eq. 5-7: a degree either divides each tier's size or is a
multiple of it, so every
group is whole packages, whole nodes or whole sets of nodes; ``aligned=False`` searches every divisor of
the world), and a secondary partition only over at most the primary's group (hpZ's use of it: keep the
backward gather inside a tier the forward gather crosses). The presets are always costed. Each
candidate gets its memory per device, its bytes per tier and its predicted step time; plans over the
device memory are kept but marked, and the list is sorted fits first, then by step time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from zerotopo.cost.bandwidth import BandwidthTable, default_table
from zerotopo.cost.comm import CollectiveCost, bytes_by_tier, grad_width, schedule_of
from zerotopo.cost.memory import GIB, MemoryBreakdown, _memory, max_model_params
from zerotopo.cost.muon import MuonCost, MuonPricing, muon_cost, ns_seconds_lower_bound, with_muon
from zerotopo.cost.presets import resolve, runtime_costs
from zerotopo.cost.time import (
    OptimizerShard,
    OverlapModel,
    StepTime,
    collective_time,
    device_overlap,
    quantizer_time,
    step_time,
)
from zerotopo.errors import PlanError
from zerotopo.placement.plan import PRESETS, Degrees, Plan, enumerate_plans
from zerotopo.placement.schedule import ENGINE, Collective, ScheduleModel, StepSchedule
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

#: Lins-style plans added to the presets by ``plans="auto"``.
AUTO_TOP = 5
#: Step times this close (relative) count as a tie in the recommendation; the smaller plan wins.
TIE = 0.005
#: The relative error of the model's step predictions against measured steps: every engine and
#: DeepSpeed row of ``zerotopo bench compare`` within 15% of its measured step (docs/cost-model.md,
#: "Measured error"). Plans closer than this are reported as tied, and ``plans="auto"`` stops its
#: search where no candidate left could beat the ones found by more than this.
MODEL_ERROR = 0.15


@dataclass(frozen=True)
class CostOptions:
    """Precision and training settings shared by every candidate."""

    micro_batch: int = 1
    """Samples per micro-batch per device."""
    grad_accum: int = 1
    """Micro-batches per step (``M``)."""
    efficiency: float = 0.5
    """Fraction of peak FLOPS the compute reaches."""
    achieved_tflops: float | None = None
    """TFLOPS per device the compute reaches (measured: ``zerotopo calibrate``'s ``compute.tflops``);
    replaces ``efficiency`` when given."""
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
    config's default, ``PrecisionConfig.grad_dtype``: DeepSpeed's, the model dtype); a plan's own wins."""
    optim_bytes_per_param: int = 12
    """fp32 master + Adam m, v (an elementwise optimizer's; ``muon`` replaces it)."""
    muon: MuonPricing | None = None
    """Price a Muon run (:mod:`zerotopo.cost.muon`): its state bytes per parameter replace
    ``optim_bytes_per_param``, and every candidate's step adds the Newton-Schulz time of its ``optim``
    group's busiest owner and the exchange's two all-to-alls, so the search ranks plans by Muon's step.
    None: an elementwise optimizer."""
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
    search_tolerance: float = MODEL_ERROR
    """``plans="auto"`` simulates candidates in order of a lower bound on their step time and stops once
    the bound passes the AUTO_TOP-th best simulated time times ``1 - search_tolerance``: a candidate
    left out is at most that much faster than the ones reported (tied within the model's error). 0: an
    exact search (every candidate whose bound is below the AUTO_TOP-th best is simulated)."""

    def __post_init__(self) -> None:
        if not 0 <= self.search_tolerance < 1:
            raise ValueError(f"search_tolerance must be in [0, 1), got {self.search_tolerance!r}")

    @property
    def state_bytes_per_param(self) -> int:
        """Optimizer-state bytes per parameter of the optimizer priced (Muon's when ``muon`` is set)."""
        return self.muon.state_bytes_per_param if self.muon is not None else self.optim_bytes_per_param

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
    (:func:`~zerotopo.cost.memory.max_model_params`: no buffers or activations, as Xu et al., "Scaling
    Large Language Model Training on Frontier with Low-Bandwidth Partitioning" (arXiv:2501.04266) §I
    counts)."""
    muon: MuonCost | None = field(default=None, compare=False)
    """Muon's share of the step (``CostOptions.muon``), already in ``time`` and ``memory``; None when
    the optimizer priced is elementwise."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def unit_layers(self) -> int | None:
        """Layers per unit of the schedule costed (None for DeepSpeed's per-module schedule)."""
        return None if self.schedule is None else self.schedule.options.unit_layers

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
        } | ({} if self.muon is None else {"muon": self._muon_json()})

    def _muon_json(self) -> dict:
        c = self.muon
        assert c is not None
        return {
            "matrices": c.matrices,
            "ns_flops": c.ns_flops,
            "ns_s": c.ns_s,
            "flops_imbalance": c.flops_imbalance,
            "exchange_bytes": c.exchange_bytes,
            "exchange_s": c.exchange_s,
            "exchange_tier": c.exchange_tier,
            "state_bytes_per_param": c.state_bytes_per_param,
            "owned_bytes": c.owned_bytes,
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
    """The planner's pre-filter (as Lins' Pre-Filter, Lins (Chen et al., IWQoS 2024) §V-A) on a valid plan.

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


@dataclass(frozen=True)
class _Fit:
    """A candidate before its schedule: the resolved plan, its units and its memory."""

    plan: Plan
    degrees: Degrees
    options: ScheduleModel
    units: list
    memory: MemoryBreakdown
    fits: bool
    grad_bytes: int
    reduce_bytes: int


@dataclass
class _Search:
    """What the candidates of one planner call share ([Note: one search] in :func:`plan_candidates`)."""

    units: dict = field(default_factory=dict)
    """A schedule's ``units_key`` -> the model's units."""
    schedules: dict = field(default_factory=dict)
    """(schedule options, layers per unit) -> those options with that many layers per unit."""
    distinct: dict = field(default_factory=dict)
    """id of a units list -> (the list, its distinct units and their counts): see :func:`_bound`."""
    times: dict = field(default_factory=dict)
    """A collective's time, by what it depends on."""
    collectives: dict = field(default_factory=dict)
    """The collectives of a schedule step, built once for the degrees, codec and size they depend on."""
    muon: dict = field(default_factory=dict)
    """Degrees -> Muon's cost (:func:`_muon`) and, under ``("bound", Degrees)``, its lower bound."""


def _fit(
    plan: Plan,
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    degrees: Degrees | None,
    unit_layers: int | None = None,
    schedule: ScheduleModel | None = None,
    search: _Search | None = None,
) -> _Fit:
    """The memory side of a candidate (no schedule is built: the planner prunes by memory first)."""
    plan, sched = resolve(plan)
    sched = schedule or sched
    if unit_layers is not None and sched.unit_layers is not None:
        sched = _with_unit_layers(sched, unit_layers, search)
    if plan.grad_dtype is None and options.grad_dtype is not None:
        plan = replace(plan, grad_dtype=options.grad_dtype)
    d = degrees or plan.degrees(topology)
    o = options
    key = sched.units_key
    units = None if search is None else search.units.get(key)
    if units is None:
        units = sched.units(shape)
        if search is not None:
            search.units[key] = units
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
        o.state_bytes_per_param,
        True,
        o.micro_batch,
        shape,
        o.checkpoint_activations,
        hold_gathered=sched.hold_gathered,
    )
    limit = options.memory_limit_bytes
    if limit is None:
        limit = topology.device.memory_gib * GIB
    return _Fit(plan, d, sched, units, memory, memory.total <= limit, grad_bytes, reduce_bytes)


def _with_unit_layers(sched: ScheduleModel, k: int, search: _Search | None) -> ScheduleModel:
    """``sched`` with ``k`` layers per unit (one object per pair within a search)."""
    if search is None:
        return sched.with_unit_layers(k)
    out = search.schedules.get((sched, k))
    if out is None:
        out = search.schedules[(sched, k)] = sched.with_unit_layers(k)
    return out


def _schedule(
    f: _Fit, topology: Topology, options: CostOptions, shared: dict | None, units: list | None = None
) -> StepSchedule:
    """``f``'s step schedule (of ``units`` when given: the distinct units the lower bound needs)."""
    return schedule_of(
        [],
        topology,
        f.plan,
        micro_batches=options.grad_accum,
        param_bytes=options.param_bytes,
        reduce_bytes=f.reduce_bytes,
        grad_shard_bytes=f.grad_bytes,
        fp16=options.fp16,
        options=f.options,
        degrees=f.degrees,
        units=f.units if units is None else units,
        shared=shared,
    )


def _complete(f: _Fit, topology: Topology, options: CostOptions, shared: dict | None):
    return f.plan, f.degrees, f.memory, _schedule(f, topology, options, shared), f.fits


def _finish(
    prepared, shape: ModelShape, topology: Topology, options: CostOptions, search: _Search | None = None
) -> PlanEstimate:
    plan, d, memory, schedule, fits = prepared
    o = options
    comm = schedule.collectives()
    muon = _muon(d, shape, topology, o, search)
    t = retime(plan, d, schedule, shape, topology, o, muon=muon)
    limit = o.memory_limit_bytes if o.memory_limit_bytes is not None else topology.device.memory_gib * GIB
    if muon is not None and muon.owned_bytes:  # the busiest owner's whole matrices, beside its chunks
        memory = replace(memory, optim=memory.optim + muon.owned_bytes)
        fits = fits and memory.total <= limit
    grad_bytes = grad_width(plan, o.param_bytes) if o.grad_bytes is None else o.grad_bytes
    biggest = max_model_params(
        topology, plan, param_bytes=o.param_bytes, grad_bytes=grad_bytes,
        optim_bytes_per_param=o.state_bytes_per_param, memory_bytes=limit,
    )  # fmt: skip
    return PlanEstimate(
        plan, d, memory, comm, bytes_by_tier(comm, topology), t, fits, schedule, biggest, muon=muon
    )


def _muon(
    d: Degrees, shape: ModelShape, topology: Topology, o: CostOptions, search: _Search | None = None
) -> MuonCost | None:
    """Muon's cost under ``d`` when ``o`` prices Muon (once per degrees within a search), else None."""
    if o.muon is None:
        return None
    hit = None if search is None else search.muon.get(d)
    if hit is None:
        hit = muon_cost(
            shape, d, topology, ns_steps=o.muon.ns_steps, aux_states=o.muon.aux_states,
            efficiency=o.efficiency, achieved_tflops=o.achieved_tflops,
        )  # fmt: skip
        if search is not None:
            search.muon[d] = hit
    return hit


def _muon_bound(d: Degrees, shape: ModelShape, topology: Topology, o: CostOptions, search: _Search) -> float:
    """A lower bound on what Muon adds to the step under ``d`` (0 for an elementwise optimizer)."""
    if o.muon is None:
        return 0.0
    key = ("bound", d.optim)
    hit = search.muon.get(key)
    if hit is None:
        hit = search.muon[key] = ns_seconds_lower_bound(
            shape, d, topology, ns_steps=o.muon.ns_steps, efficiency=o.efficiency,
            achieved_tflops=o.achieved_tflops,
        )  # fmt: skip
    return hit


def retime(
    plan: Plan,
    d: Degrees,
    schedule: StepSchedule,
    shape: ModelShape,
    topology: Topology,
    o: CostOptions,
    *,
    muon: MuonCost | None = None,
) -> StepTime:
    """The step time of a built schedule under ``o``'s compute, curves and overlap (the schedule does
    not depend on them: a sweep over those inputs builds it once). With ``o.muon`` set, Muon's step is
    added (:func:`zerotopo.cost.muon.with_muon`; ``muon``: its cost when already computed)."""
    grad_bytes = grad_width(plan, o.param_bytes) if o.grad_bytes is None else o.grad_bytes
    t = step_time(
        schedule,
        topology,
        shape,
        micro_batch=o.micro_batch,
        efficiency=o.efficiency,
        checkpoint_activations=o.checkpoint_activations,
        table=o.table(topology),
        overlap=o.overlap,
        achieved_tflops=o.achieved_tflops,
        runtime=runtime_costs(schedule.options),
        optimizer=OptimizerShard(shape.param_count() // d.optim, grad_bytes, o.param_bytes),
    )
    muon = muon or _muon(d, shape, topology, o)
    return t if muon is None else with_muon(t, muon)


def estimate(
    plan: Plan,
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    *,
    degrees: Degrees | None = None,
    schedule: ScheduleModel | None = None,
    shared: dict | None = None,
) -> PlanEstimate:
    """Memory, bytes per tier and step time of one plan (``degrees``: already resolved), on the engine's
    schedule or on ``schedule`` (another framework's, e.g. the lab's DeepSpeed presets). ``shared``: as in
    :func:`~zerotopo.placement.schedule.step_schedule`."""
    sched = schedule or resolve(plan)[1]
    choices = options.unit_layers if sched.unit_layers is not None and schedule is None else (None,)
    out = [
        _finish(
            _complete(_fit(plan, shape, topology, options, degrees, k, schedule), topology, options, shared),
            shape,
            topology,
            options,
        )
        for k in choices
    ]
    return min(out, key=_sort_key)


def _lower_bound(
    schedule: StepSchedule,
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    weights: Sequence[int] | None = None,
    times: dict[int, tuple] | None = None,
) -> float:
    """A step time no simulation of ``schedule`` can beat: every micro-batch lasts at least its compute,
    its gathers back to back and its reductions back to back (the first's parameter gathers and the
    last's cross-replica reductions spread over all, which no split beats; sharing links and slowdown
    only add), and the step end adds its collectives less what may
    hide.

    ``weights``: ``schedule`` holds each distinct unit once (:func:`_distinct_units`) and ``weights[i]``
    is how many units unit ``i`` stands for. ``times``: collective times by object, kept across calls
    (each held, so its id stays its own)."""
    o = options
    table = o.table(topology)
    M = schedule.micro_batches
    peak = topology.device.peak_tflops * 1e12
    flops = shape.step_flops(o.micro_batch * M, checkpoint_activations=o.checkpoint_activations)
    compute = flops / (peak * o.efficiency) / M if peak > 0 else 0.0
    # by object, holding it: an id is unique only while its object lives
    seen: dict[int, tuple[Collective, float, float]] = {} if times is None else times

    def total(colls, which: int = 1) -> float:
        # which: 1 the collective's time, 2 its quantizer passes' time
        out = 0.0
        for c in colls:
            hit = seen.get(id(c))
            if hit is None:
                hit = seen[id(c)] = (c, collective_time(c, topology, table), quantizer_time(c, topology))
            out += hit[which]
        return out

    def forward(u, which: int = 1) -> float:
        # a micro-batch's forward gathers on average (a first micro-batch may gather otherwise): the sum
        # over micro-batches of each one's bound is at least M times the bound of their average
        return sum(n * total(colls, which) for colls, n in u.forward_counts(M)) / M

    units = schedule.units
    w = [1] * len(units) if weights is None else weights
    g = sum(k * (forward(u) + total(u.backward)) for k, u in zip(w, units))
    r = sum(k * total(u.reduce) for k, u in zip(w, units))
    # the first micro-batch's parameter gathers and the last one's cross-replica reductions: on their
    # own stream, or queued with the reductions (c == 2) or all communication (c == 1)
    extra = sum(k * (total(u.last_reduce) + total(u.first_forward)) for k, u in zip(w, units))
    c = o.overlap.concurrent
    comm = g + r if c == 1 else max(g, r)
    edge = g + r + extra / M if c == 1 else max(g, r + extra / M) if c == 2 else max(g, r, extra / M)
    # [Note: slowdown bound] the block quantizer's passes Q run on the compute stream (time.py), and a
    # stream busy for B seconds in a micro-batch spends each second either beside compute, slowing it by
    # sigma, or beside the quantizer passes and the slowdown itself (at most Q + the slowdown), or while
    # neither runs (added whole): the micro-batch lasts at least compute + max(Q, (sigma B + Q)/(1 + sigma))
    sigma = device_overlap(o.overlap, topology).compute_slowdown
    q = sum(k * (forward(u, 2) + total(u.backward, 2) + total(u.reduce, 2)) for k, u in zip(w, units))
    slowed = compute + max(q, (sigma * comm + q) / (1 + sigma))
    if weights is None:
        end = total(schedule.step_end)
    else:
        # each unit's step-end share: its cross-replica reduction and parameter gather where the
        # schedule did not move them into the micro-batches; then the scalars
        end = sum(
            k * (total(() if u.last_reduce else u.replica) + total(() if u.first_forward else u.param_gather))
            for k, u in zip(w, units)
        ) + total(x for x in schedule.step_end if x.phase == "scalar")
    bwd_share = 1 - 1 / (4.0 if o.checkpoint_activations else 3.0)
    return M * max(slowed, comm, edge) + end - min(o.overlap.step_end_overlap * end, compute * bwd_share)


def _distinct_units(units: list) -> tuple[list, list[int]] | None:
    """Each distinct unit once, the last kept last (it has no backward gather), and how many units each
    stands for: every per-unit collective of the engine's schedule depends only on the unit, so sums
    over units need each once. None when the units are all distinct."""
    firsts: dict = {}
    counts: dict = {}
    for u in units[:-1]:
        key = (u.numel, u.gathered)
        firsts.setdefault(key, u)
        counts[key] = counts.get(key, 0) + 1
    if len(firsts) + 1 == len(units):
        return None
    return [*firsts.values(), units[-1]], [*counts.values(), 1]


def _bound(f: _Fit, shape: ModelShape, topology: Topology, options: CostOptions, search: _Search) -> float:
    """:func:`_lower_bound` of a candidate, from a schedule of its distinct units where the schedule's
    per-unit collectives depend on the unit alone (no buckets), else from its whole schedule."""
    o = f.options
    distinct = None
    if o.per_unit:
        # candidates share their units list (``_fit``'s cache): find its distinct units once
        hit = search.distinct.get(id(f.units))
        if hit is None:
            hit = search.distinct[id(f.units)] = (f.units, _distinct_units(f.units))
        distinct = hit[1]
    times, shared = search.times, search.collectives
    extra = _muon_bound(f.degrees, shape, topology, options, search)
    if distinct is None:
        sched = _schedule(f, topology, options, shared)
        return _lower_bound(sched, shape, topology, options, times=times) + extra
    units, weights = distinct
    sched = _schedule(f, topology, options, shared, units)
    # a sum of k equal terms may round differently from k additions: keep the bound below the exact one
    return (_lower_bound(sched, shape, topology, options, weights, times) + extra) * (1 - 1e-9)


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


def _search_space(topology: Topology, aligned: bool, taken: set[tuple]) -> list[tuple[Plan, Degrees]]:
    """The Lins-style candidates (:func:`in_search_space`) not already costed as a preset."""
    keep = (lambda x: is_tier_aligned(x, topology)) if aligned else None
    # the enumerated plans' degrees are numbers, so many plans share one resolved Degrees: resolve (and
    # validate) each combination once; secondaries wider than the primary are dropped before any plan
    # is built (in_search_space)
    resolved: dict[tuple, Degrees] = {}
    out = []
    narrow = lambda p, g, o, s: s is None or s <= p  # noqa: E731
    for p in enumerate_plans(topology, degree_filter=keep, keep=narrow):
        k = (p.params, p.grads, p.optim, p.secondary)
        d = resolved.get(k)
        if d is None:
            d = resolved[k] = p.degrees(topology)
        if (
            in_search_space(p, topology, aligned=aligned, degrees=d)
            and placement(p, topology, d) not in taken
        ):
            out.append((p, d))
    return out


def plan_candidates(
    shape: ModelShape,
    topology: Topology,
    *,
    micro_batch: int = 1,
    grad_accum: int = 1,
    plans: str | Sequence[str | Plan | tuple[Plan, ScheduleModel]] = "auto",
    aligned: bool = True,
    options: CostOptions | None = None,
    **option_kwargs,
) -> list[PlanEstimate]:
    """Cost the candidate plans and sort them: fitting plans first, fastest first.

    ``plans``: ``"all"`` (every valid plan: presets and Lins-style degrees), ``"auto"`` (the presets plus
    the :data:`AUTO_TOP` fastest fitting Lins-style plans), ``"presets"``, or a list of preset names,
    :class:`Plan` objects and ``(Plan, ScheduleModel)`` pairs (a plan priced on another framework's
    schedule). Other keyword arguments are :class:`CostOptions` fields.
    """
    opts = options or CostOptions(micro_batch=micro_batch, grad_accum=grad_accum, **option_kwargs)
    if isinstance(plans, str) and plans not in ("all", "auto", "presets"):
        plans = [p for p in plans.split(",") if p.strip()]
    # [Note: one search] the candidates of one call share their collectives (built once for the degrees,
    # codec and size they depend on), those collectives' times, and the model's units
    search = _Search()
    shared = search.collectives
    if not isinstance(plans, str):
        chosen = [
            p if isinstance(p, tuple) else (p if isinstance(p, Plan) else resolve(p)[0], None) for p in plans
        ]
        return sorted(
            (estimate(p, shape, topology, opts, schedule=s, shared=shared) for p, s in chosen), key=_sort_key
        )
    presets = _presets(topology)
    out = [estimate(p, shape, topology, opts, shared=shared) for p in presets]
    if plans == "presets":
        return sorted(out, key=_sort_key)
    space = _search_space(topology, aligned, {placement(p, topology) for p in presets})
    fits = [_fit(p, shape, topology, opts, d, k, search=search) for p, d in space for k in opts.unit_layers]
    if plans == "all":
        best: dict[tuple, PlanEstimate] = {}
        for f in fits:  # each plan with its best unit size
            e = _finish(_complete(f, topology, opts, shared), shape, topology, opts, search)
            key = placement(e.plan, topology, e.degrees)
            if key not in best or _sort_key(e) < _sort_key(best[key]):
                best[key] = e
        return sorted(out + list(best.values()), key=_sort_key)
    return sorted(out + _auto(fits, shape, topology, opts, search), key=_sort_key)


def _auto(
    fits: list[_Fit], shape: ModelShape, topology: Topology, options: CostOptions, search: _Search
) -> list[PlanEstimate]:
    """The :data:`AUTO_TOP` fastest fitting candidates: pruned by memory first, then simulated in order of
    a lower bound on their step time, stopping once the bound passes the AUTO_TOP-th best simulated
    time less ``options.search_tolerance`` (0: exact, no candidate left out could have been faster).
    Schedules are built only for the bound (each distinct unit once) and for the candidates simulated."""
    bounded = sorted(
        ((_bound(f, shape, topology, options, search), i, f) for i, f in enumerate(fits) if f.fits),
        key=lambda t: (t[0], t[1]),
    )
    best: dict[tuple, PlanEstimate] = {}  # each placement with its best unit size
    top: list[PlanEstimate] = []  # the AUTO_TOP best of ``best``, sorted
    keep = 1 - options.search_tolerance
    for bound, _, f in bounded:
        if len(top) >= AUTO_TOP and bound > top[AUTO_TOP - 1].time.step_time_s * keep:
            break
        e = _finish(_complete(f, topology, options, search.collectives), shape, topology, options, search)
        key = placement(e.plan, topology, e.degrees)
        old = best.get(key)
        if old is not None and _sort_key(old) <= _sort_key(e):
            continue  # the same plan with another unit size is already faster
        best[key] = e
        top = sorted([x for x in top if x is not old] + [e], key=_sort_key)[:AUTO_TOP]
    return top


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
    # priced on e's own schedule: a DeepSpeed preset's alternative runs on DeepSpeed's too
    own = e.schedule.options if e.schedule is not None and e.schedule.options.name != ENGINE.name else None
    nosec = replace(e.plan, name=f"{e.plan.name}-nosec", secondary=None)
    alt = estimate(nosec, shape, topology, options, schedule=own)
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


def pick(estimates: list[PlanEstimate], step: Callable[[PlanEstimate], float] | None = None) -> PlanEstimate:
    """The plan the planner recommends among ``estimates``: of those whose step (``step``, default the
    predicted step) lies within :data:`TIE` of the fastest, the one needing least memory (the model
    cannot tell them apart)."""
    step = step or (lambda e: e.time.step_time_s)
    fastest = min(step(e) for e in estimates)
    near = [e for e in estimates if step(e) <= fastest * (1 + TIE)]
    return min(near, key=lambda e: (e.memory.total, step(e)))


def recommendation(
    estimates: list[PlanEstimate],
    shape: ModelShape,
    topology: Topology,
    options: CostOptions,
    others: Collection[str] = (),
) -> str:
    """The plan to use, with a one-line reason, and any secondary partition that costs memory for nothing.
    ``others``: names of plans priced on another framework's schedule, recommended only when nothing else
    fits."""
    lines = []
    cands = [e for e in estimates if e.fits]
    for e in list(cands):
        alt = secondary_alternative(e, shape, topology, options)
        if alt is not None:
            cands.append(alt[0])
            lines.append(alt[1])
    if not cands:
        return "no plan fits the device memory: use more nodes, a smaller micro-batch or activation checkpointing"
    # another framework's cost presets price its schedule: recommend a plan the engine runs
    runnable = [c for c in cands if c.plan.name not in others] or cands
    fastest = min(runnable, key=_sort_key)
    best = pick(runnable)
    # the runner-up is another plan: not best again under another name (hsdp is mics) or from a second list
    rest = distinct_plans([best, *sorted(cands, key=_sort_key)], topology)[1:]
    runner = [c for c in rest if c.name != best.name]
    reason = (
        f"fastest plan that fits: {best.time.step_time_s:.3f} s per step, {best.memory.total / GIB:.1f} GiB per device"
        if best is fastest
        else f"within {100 * TIE:g}% of the fastest plan that fits ({best.time.step_time_s:.3f} s vs "
        f"{fastest.time.step_time_s:.3f} s per step) with the least memory, {best.memory.total / GIB:.1f} GiB per device"
    )
    if runner:
        r = runner[0]
        reason += f", {r.time.step_time_s / best.time.step_time_s:.2f}x the throughput of {r.name}"
    name = shown(best, topology)
    if best.unit_layers not in (None, 1):
        name += f" with {best.unit_layers} layers per unit"
    lines.insert(0, f"recommended: {name}: {reason}")
    tied = tie_line(runnable, topology)
    if tied:
        lines.insert(1, tied)
    return "\n".join(lines)


def shown(e: PlanEstimate, topology: Topology) -> str:
    """A plan as the recommendation names it: its name, then its degrees where they differ from it (a
    plan of the search is named by its degrees)."""
    label = e.plan.label(topology)
    return e.name if e.name == label else f"{e.name} ({label})"


def distinct_plans(estimates: list[PlanEstimate], topology: Topology) -> list[PlanEstimate]:
    """``estimates`` with each plan once, the first of each kept. Two estimates are one plan when they
    cost one placement (:func:`placement`) on one schedule and unit size (a plan named twice, a preset
    under another name: hsdp is mics; a plan without its secondary partition that the search also found)
    or when they print alike (:func:`shown`)."""
    seen: set = set()
    out = []
    for e in estimates:
        schedule = None if e.schedule is None else e.schedule.options.name
        keys = {(placement(e.plan, topology, e.degrees), schedule, e.unit_layers), shown(e, topology)}
        if keys.isdisjoint(seen):
            out.append(e)
        seen |= keys
    return out


def tie_line(estimates: list[PlanEstimate], topology: Topology, error: float = MODEL_ERROR) -> str:
    """One line naming the plans whose predicted steps lie within the model's measured ``error`` of the
    fastest (the model cannot rank them), the tie broken by memory; empty when only one plan does (an
    estimate of the same plan again is not a tie: :func:`distinct_plans`)."""
    fastest = min(estimates, key=_sort_key)
    near = [e for e in estimates if e.time.step_time_s <= fastest.time.step_time_s * (1 + error)]
    tied = distinct_plans(sorted(near, key=_sort_key), topology)
    if len(tied) < 2:
        return ""
    fastest = tied[0]
    small = min(tied, key=lambda e: (e.memory.total, e.time.step_time_s))
    slowest = max(e.time.step_time_s for e in tied)
    head = (
        f"tied: {len(tied)} plans predict {fastest.time.step_time_s:.3f}-{slowest:.3f} s per step, within "
        f"the model's measured error ({100 * error:g}%) of each other, so it cannot rank them; "
    )
    if small is fastest:
        return head + (
            f"the fastest, {shown(fastest, topology)}, also needs the least memory, "
            f"{fastest.memory.total / GIB:.1f} GiB per device"
        )
    return head + (
        f"by memory {shown(small, topology)} wins with {small.memory.total / GIB:.1f} GiB per device "
        f"against {fastest.memory.total / GIB:.1f} GiB for the fastest, {fastest.name}"
    )
