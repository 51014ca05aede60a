"""The per-unit communication schedule of a training step, as data.

[Note: schedule as data] A step is, per micro-batch and per *unit* (what one all-gather fetches: the
engine's flat units — embedding, each layer, head), a list of collectives:

- ``forward``: gathers issued before the unit's forward compute;
- ``backward``: gathers issued before the unit's backward compute (none for the last forward unit,
  which keeps its weights for the backward that follows at once);
- ``reduce``: gradient reductions issued after the unit's backward compute;

and, once per step, the ``step_end`` collectives (post-step parameter all-gather, scalar all-reduces;
the cross-replica gradient reduction too unless it runs in the backward) that run after the last
backward and never overlap compute. With :attr:`ScheduleOptions.step_end_in_backward` (the engine's
``set_is_last_backward``) each unit's cross-replica reduction is its ``last_reduce``: issued in the last
micro-batch's backward right after the unit's own reduction, beside the rest of the backward. With
:attr:`ScheduleOptions.param_gather_in_forward` (the engine's lazy parameter gather) a sharded unit's
post-step parameter all-gather is its ``first_forward``: in flight from the start of the (next) step's
first micro-batch, and waited for by the unit's first forward gather. A unit whose first micro-batch
gathers otherwise than the later ones has those gathers as its ``first_micro_forward`` (the engine's
units have none; DeepSpeed's hpZ gathers over the job until its copy per node exists, then within the
node).

Each :class:`Collective` carries its phase, ledger op, group kind and size, the tier it crosses and the
group's span (nodes, ranks per node), its codec, the bytes one rank sends (the ledger's count), the
whole message's bytes (what a bandwidth table is indexed by) and whether it can overlap compute.
:meth:`StepSchedule.collectives` merges identical calls into counts: the list
:func:`zerotopo.cost.comm.comm_per_step` returns and the runtime ledger is compared with. The time
model (:mod:`zerotopo.cost.time`) walks the per-unit lists; the engine executes them
(:func:`engine_unit_steps`: the runtime and the optimizer run each unit's entries).

This module describes what the engine runs and nothing else. Another framework's schedule is priced by the
same cost model when a :class:`ScheduleModel` describes it: it emits a :class:`StepSchedule` (usually
through a subclass of :class:`ScheduleBuilder` that overrides its hooks) and says which units it cuts the
model into.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Protocol

from zerotopo.placement import volume
from zerotopo.placement.codecs import CODECS, Codec, PlanCodecs, plan_codecs
from zerotopo.placement.layout import groups, padded_numel
from zerotopo.placement.plan import Degrees, Plan
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

PHASES = ("forward", "backward", "grad_reduce", "replica_reduce", "param_gather", "scalar")
#: Phases that repeat every micro-batch (the rest run once per step).
MICRO_BATCH_PHASES = ("forward", "backward", "grad_reduce")


#: Codecs whose collectives run the block quantizer.
QUANTIZED = ("int8", "int4")


@dataclass(frozen=True)
class Collective:
    """One collective call (``count`` = 1) or, in a merged list, identical calls and how many run."""

    phase: str
    """``forward``, ``backward``, ``grad_reduce``, ``replica_reduce``, ``param_gather`` or ``scalar``."""
    op: str
    """As the runtime ledger names it: ``all_gather``, ``all_gather_int8``, ``reduce_scatter``,
    ``reduce_scatter_int4`` (the all-to-all based one, each hop of the two-hop form) or ``all_reduce``."""
    group: str
    """Group kind (:func:`zerotopo.placement.layout.groups`); ``grads_intra``/``grads_inter`` for the hops of the
    two-hop int4 reduce-scatter and ``world`` for the fp16 overflow check (the mesh's extra kinds)."""
    group_size: int
    """Ranks in the group (for a hop of the two-hop all-to-all: ranks in that hop)."""
    tier: str
    """Outermost tier the group crosses."""
    bytes_sent: int
    """Bytes one rank sends in one call."""
    count: int
    """Calls per step."""
    dtype: str
    """Codec of the payload: ``bf16``/``fp16``/``fp32`` (by byte width) or ``int8``/``int4``."""
    message_bytes: int = field(default=0, compare=False)
    """Bytes of the whole message (gathered output, reduce input, all-reduce buffer) in its codec."""
    overlappable: bool = field(default=True, compare=False)
    """Whether it may run while compute runs (the step-end collectives may not)."""
    nodes: int = field(default=1, compare=False)
    """Nodes the group spans."""
    ranks_per_node: int = field(default=0, compare=False)
    """Ranks of the group in each node it spans (``group_size`` when one node)."""
    quant_numel: int = field(default=0, compare=False)
    """Values the block quantizer passes over on one rank per call (quantize what it sends, dequantize what
    it receives); 0 for the plain codecs. :func:`zerotopo.cost.time.collective_time` charges it at the
    device's ``quant_gbps``."""
    value_bytes: int = field(default=4, compare=False)
    """Width of the values the quantizer takes in and gives back (the gathered weights' for an int8
    gather, the reduced gradients' for an int4 reduce-scatter): its passes are priced by it."""

    @property
    def total_bytes(self) -> int:
        """Bytes one rank sends in all calls of the step."""
        return self.bytes_sent * self.count

    @property
    def latency_steps(self) -> int:
        """Message steps of the ring algorithm: ``d-1``, twice that for an all-reduce."""
        return (2 if self.op == "all_reduce" else 1) * (self.group_size - 1)


@dataclass(frozen=True)
class Unit:
    """What one gather fetches and one compute uses."""

    name: str
    """``embedding``, ``layer``, ``head`` (engine units), or a framework's own unit names."""
    numel: int
    """Parameters of the unit (its gradient elements)."""
    gather_numel: int | None = None
    """Parameters gathered (None: all; a framework may keep some parameters whole on every rank)."""
    flops: float = 0.0
    """Forward FLOPs per sample (0 when only bytes are wanted)."""

    @property
    def gathered(self) -> int:
        return self.numel if self.gather_numel is None else self.gather_numel


@dataclass(frozen=True)
class UnitSteps:
    """The collectives around one unit in one micro-batch (each a single call)."""

    unit: Unit
    forward: tuple[Collective, ...]
    backward: tuple[Collective, ...]
    reduce: tuple[Collective, ...]
    prefetch: int
    """Units ahead whose forward gathers may be in flight while this one computes its forward."""
    prefetch_backward: int = 1
    """Units (in backward order) whose backward gathers may be in flight while this one computes."""
    last_reduce: tuple[Collective, ...] = ()
    """In the last micro-batch only: the cross-replica reduction issued after ``reduce`` (see the note)."""
    first_forward: tuple[Collective, ...] = ()
    """In the first micro-batch only: the post-step parameter all-gather, issued at its start, that the
    unit's forward gather waits for (see the note)."""
    replica: tuple[Collective, ...] = field(default=(), compare=False)
    """The unit's cross-replica reduction, in order, wherever the timing places it (``last_reduce`` or
    ``step_end``): what the engine's optimizer executes."""
    param_gather: tuple[Collective, ...] = field(default=(), compare=False)
    """The unit's post-step parameter all-gather, wherever the timing places it (``first_forward`` or
    ``step_end``): what the engine's optimizer executes."""
    first_micro_forward: tuple[Collective, ...] | None = None
    """In the first micro-batch, in place of ``forward``: its own forward gathers, when they differ from
    the later micro-batches' (None: every micro-batch gathers ``forward``; see the note)."""

    def forward_in(self, first: bool) -> tuple[Collective, ...]:
        """The forward gathers of the step's first micro-batch (``first``) or of a later one."""
        return self.first_micro_forward if first and self.first_micro_forward is not None else self.forward

    def forward_counts(self, micro_batches: int) -> list[tuple[tuple[Collective, ...], int]]:
        """Each list of forward gathers with the number of a step's ``micro_batches`` that issue it."""
        if self.first_micro_forward is None:
            return [(self.forward, micro_batches)]
        return [(self.forward, micro_batches - 1), (self.first_micro_forward, 1)]


class ScheduleModel(Protocol):
    """What the cost model asks of a schedule: which units it cuts a model into and how it builds a
    :class:`StepSchedule` of them. :class:`ScheduleOptions` is the engine's; another framework's model
    (priced beside the engine's) implements the same attributes."""

    name: str
    unit_layers: int | None
    """Layers per unit the planner may vary (None: the model's units are fixed)."""
    step_end_in_backward: bool
    """Each unit's cross-replica reduction runs in the last micro-batch's backward (see the note)."""
    param_gather_in_forward: bool
    """A sharded unit's post-step parameter all-gather stays in flight into the next step's first forward."""
    builder: ClassVar[type[ScheduleBuilder]]
    """The builder :func:`step_schedule` builds this schedule with."""
    runtime: Any
    """The framework's fixed runtime costs (a :class:`zerotopo.cost.time.RuntimeCosts`), None for none."""
    hold_gathered: bool
    """Gathered weights stay until their backward (none is gathered again): the memory model holds them."""
    per_unit: bool
    """Each unit's collectives depend on that unit alone (no buckets across units), so sums over units
    need each distinct unit once."""
    units_key: tuple
    """What :meth:`units` depends on (the planner caches the units under it)."""

    def units(self, shape: ModelShape) -> list[Unit]:
        """The units of ``shape``, forward order, with their forward FLOPs per sample."""
        ...

    def with_unit_layers(self, k: int) -> ScheduleModel:
        """This schedule with ``k`` layers per unit."""
        ...


@dataclass(frozen=True)
class ScheduleOptions:
    """The engine's schedule: its knobs, and the :class:`ScheduleModel` the cost model prices engine plans
    with."""

    name: str = "zerotopo"
    unit_layers: int = 1
    """Layers per unit (the engine runs 1; a larger unit means larger messages and buffers)."""
    step_end_in_backward: bool = True
    """Each unit's cross-replica gradient reduction starts in the last micro-batch's backward, once its
    gradient shard is final (the engine with ``set_is_last_backward``, as ``zerotopo train`` runs it);
    False: all of them after the backward."""
    param_gather_in_forward: bool = True
    """A sharded unit's post-step parameter all-gather stays in flight into the next step's first forward
    (the engine's lazy parameter gather); False: at the end of the step."""
    description: str = field(default="", compare=False)

    builder: ClassVar[type[ScheduleBuilder]]
    """:class:`ScheduleBuilder` (set below it)."""
    runtime: ClassVar[Any] = None
    hold_gathered: ClassVar[bool] = False
    per_unit: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.unit_layers, int) or self.unit_layers < 1:
            raise ValueError(f"unit_layers must be a positive integer, got {self.unit_layers!r}")

    @property
    def units_key(self) -> tuple:
        return ("engine", self.unit_layers)

    def units(self, shape: ModelShape) -> list[Unit]:
        """The engine's units of ``shape`` (:func:`engine_units`)."""
        return engine_units(shape, self.unit_layers)

    def with_unit_layers(self, k: int) -> ScheduleOptions:
        return dataclasses.replace(self, unit_layers=k)


ENGINE = ScheduleOptions()


@dataclass(frozen=True)
class StepSchedule:
    """Every collective of one step, per unit and micro-batch, then the step end."""

    units: tuple[UnitSteps, ...]
    """Forward order; the backward walks them in reverse."""
    step_end: tuple[Collective, ...]
    micro_batches: int
    options: ScheduleModel = ENGINE

    def collectives(self) -> list[Collective]:
        """Identical calls merged: ``count`` says how many run per step (the ledger's view)."""
        # count by object first (units of one size share their collectives), then merge equal ones
        by_id: dict[int, list] = {}
        for u in self.units:
            for c in u.backward + u.reduce:
                by_id.setdefault(id(c), [c, 0])[1] += self.micro_batches
            for gathers, n in u.forward_counts(self.micro_batches):
                for c in gathers:
                    by_id.setdefault(id(c), [c, 0])[1] += n
        for c in [*(c for u in self.units for c in u.last_reduce + u.first_forward), *self.step_end]:
            by_id.setdefault(id(c), [c, 0])[1] += 1
        acc: Counter[Collective] = Counter()
        first: dict[Collective, Collective] = {}
        for c, n in by_id.values():
            acc[c] += n
            first.setdefault(c, c)
        out = [_with_count(first[c], n) for c, n in acc.items() if n]
        return sorted(out, key=lambda c: (PHASES.index(c.phase), c.op, c.group, c.group_size, c.bytes_sent))


def _with_count(c: Collective, count: int) -> Collective:
    return dataclasses.replace(c, count=count)


# -- groups: tier and span -------------------------------------------------------------------------

#: The degrees each group kind depends on (so the tier cache is shared between plans).
_KIND_FIELDS = {
    "params": ("params",),
    "secondary": ("secondary",),
    "grads": ("grads",),
    "optim": ("optim",),
    "grad_replicas": ("grads",),
    "optim_scatter": ("grads", "optim"),
    "optim_replicas": ("optim",),
    "param_gather": ("params", "optim"),
}

_SPAN_CACHE: dict[tuple, tuple[str | None, int, int]] = {}


def group_span(topology: Topology, d: Degrees, kind: str) -> tuple[str | None, int, int]:
    """(outermost tier crossed, nodes spanned, ranks per node) of the groups of ``kind``.

    Tier-aligned degrees give congruent groups, so every group crosses the same tier as rank 0's; for
    other degrees (12 ranks over 8-device nodes) the slowest group bounds the collective, so the tier is
    the outermost over all groups and the span the widest.
    """
    fields = _KIND_FIELDS[kind]
    vals = tuple(getattr(d, f) for f in fields)
    key = (topology, kind, d.world, vals)
    if key in _SPAN_CACHE:
        return _SPAN_CACHE[key]
    named = dict(zip(fields, vals))
    canon = Degrees(
        params=named.get("params", 1),
        grads=named.get("grads", named.get("params", 1)),
        optim=named.get("optim", named.get("grads", 1)),
        world=d.world,
        secondary=named.get("secondary"),
    )
    if len(_SPAN_CACHE) > 1 << 16:
        _SPAN_CACHE.clear()
    _SPAN_CACHE[key] = span = _group_span(topology, canon, kind)
    return span


@lru_cache(maxsize=4096)
def _group_span(topology: Topology, d: Degrees, kind: str) -> tuple[str | None, int, int]:
    order = {name: i for i, name in enumerate(topology.tier_names)}
    dpn = topology.devices_per_node
    worst: str | None = None
    nodes, per_node = 1, 1
    for g in groups(d, kind):
        t = topology.tier_of_group(g)
        if t is not None and (worst is None or order[t] > order[worst]):
            worst = t
        counts = Counter(i // dpn for i in g)
        nodes = max(nodes, len(counts))
        per_node = max(per_node, max(counts.values()))
    return worst, nodes, per_node


def group_tier(topology: Topology, d: Degrees, kind: str) -> str | None:
    """The outermost tier any group of ``kind`` crosses (None when the groups are single ranks)."""
    return group_span(topology, d, kind)[0]


def _node_share(topology: Topology, d: Degrees) -> int:
    """Ranks of rank 0's gradient group that sit in its node (the first hop of a two-hop all-to-all)."""
    return min(d.grads, topology.devices_per_node)


# -- units ------------------------------------------------------------------------------------------


def units_from_numels(unit_numels: list[int]) -> list[Unit]:
    """Engine units from element counts alone: embedding, layers, head (no FLOPs)."""
    if not unit_numels:
        raise ValueError("a model needs at least one unit")
    for n in unit_numels:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"unit element counts must be non-negative integers, got {n!r}")
    names = (
        ["embedding"] + ["layer"] * (len(unit_numels) - 2) + ["head"] if len(unit_numels) > 1 else ["layer"]
    )
    return [Unit(name, n) for name, n in zip(names, unit_numels)]


def _layer_flops(shape: ModelShape) -> tuple[float, float]:
    """Forward FLOPs per sample of one layer and of the head, from the shape's unit description (for NeoX's
    shapes ``24·s·L·h²·(1 + s/6h + V/16Lh)`` split into ``L·(24·s·h² + 4·s²·h)`` and ``1.5·s·h·V``)."""
    s = shape.seq_length
    return s * shape.layer_unit().flops_per_token, s * shape.head_unit().flops_per_token


def engine_units(shape: ModelShape, unit_layers: int = 1) -> list[Unit]:
    """The engine's units of ``shape`` with their forward FLOPs per sample: the embedding, the layers in
    groups of ``unit_layers`` (the engine runs 1; a larger unit means larger messages and buffers), the
    head."""
    if not isinstance(unit_layers, int) or unit_layers < 1:
        raise ValueError(f"unit_layers must be a positive integer, got {unit_layers!r}")
    layer_f, head_f = _layer_flops(shape)
    L = shape.num_layers
    groups = [unit_layers] * (L // unit_layers) + ([L % unit_layers] if L % unit_layers else [])
    name = "layer" if unit_layers == 1 else "layers"
    return (
        [Unit("embedding", shape.embedding_params())]
        + [Unit(name, shape.layer_params() * k, flops=layer_f * k) for k in groups]
        + [Unit("head", shape.head_params(), flops=head_f)]
    )


# -- the schedule ------------------------------------------------------------------------------------


def _exact(n: int, d: Degrees) -> int:
    unit = math.lcm(d.params, d.grads, d.optim, d.secondary or 1)
    if n % unit:
        raise ValueError(
            f"a unit of {n} elements does not split evenly over degrees {d}; use padded=True "
            f"or a multiple of {unit}"
        )
    return n


def step_schedule(
    units: list[Unit],
    topology: Topology,
    plan: Plan,
    *,
    micro_batches: int,
    param_bytes: int = 2,
    reduce_bytes: int = 4,
    grad_shard_bytes: int = 4,
    padded: bool = True,
    fp16: bool = False,
    options: ScheduleModel = ENGINE,
    degrees: Degrees | None = None,
    shared: dict | None = None,
) -> StepSchedule:
    """The schedule of one step of ``plan`` (see the module note), built by ``options.builder``.

    ``param_bytes`` is the width of the gathered weights, ``reduce_bytes`` that of the per-micro-batch
    gradient reduction and ``grad_shard_bytes`` that of the accumulated gradient shard reduced once per
    step. With ``padded=False`` units are not padded, so every count must split evenly over the groups.
    ``shared``: a dict kept across calls (the planner's, over its candidates) in which each collective is
    built once for the degrees, codec and size it depends on, and shared by every schedule that has it.
    """
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    if not units:
        raise ValueError("a model needs at least one unit")
    widths = {"param_bytes": param_bytes, "reduce_bytes": reduce_bytes, "grad_shard_bytes": grad_shard_bytes}
    b = options.builder(topology, plan, degrees or plan.degrees(topology), options, widths, shared)
    return b.build(units, micro_batches, padded=padded, fp16=fp16)


class ScheduleBuilder:
    """Builds the engine's :class:`StepSchedule`; each collective is built once for the arguments it
    depends on (in the memo a planner shares over its candidates, see :func:`step_schedule`'s ``shared``).

    A model of another framework's schedule subclasses it and overrides its hooks (:meth:`make_codecs`,
    :meth:`reductions`, :meth:`prefetch_depths`, :meth:`unit_end_param_gather`, :meth:`extra_step_end`,
    :meth:`forward_calls`, :attr:`backward_gather`), extending :attr:`context` with whatever its
    collectives depend on beyond the engine's."""

    backward_gather: bool = True
    """A sharded unit is gathered again before its backward (all but the last forward unit)."""

    def __init__(
        self,
        topology: Topology,
        plan: Plan,
        d: Degrees,
        options: ScheduleModel,
        widths: dict[str, int],
        shared: dict | None,
    ) -> None:
        self.topology, self.plan, self.d, self.options = topology, plan, d, options
        self.block, self.w = plan.quant_block, d.world
        self.param_bytes, self.grad_shard_bytes = widths["param_bytes"], widths["grad_shard_bytes"]
        self.reduce_bytes = widths["reduce_bytes"]
        self.codecs = self.make_codecs(widths)
        if d.secondary is not None:
            self.bwd = ("secondary", d.secondary, self.codecs.secondary)
        else:
            self.bwd = ("params", d.params, self.codecs.gather)
        self.spans: dict[str, tuple[str, int, int]] = {}
        self.memo: dict[tuple, tuple[Collective, ...]] = (
            {} if shared is None else shared.setdefault(id(topology), (topology, {}))[1]
        )
        self.in_bwd = options.step_end_in_backward
        # the engine leaves only sharded units' parameter gathers in flight (p = 1 units need them at once)
        self.in_fwd = options.param_gather_in_forward and d.params > 1
        # what each kind of collective depends on besides its arguments (the topology owns the memo)
        self.context = {
            "gather": (self.w, self.block, self.param_bytes),
            "reduce": (self.w, self.block, d.grads, plan.quantize_grads, widths["reduce_bytes"]),
            "replica": (
                self.w,
                self.block,
                d.grads,
                d.optim,
                plan.grad_reduce,
                self.grad_shard_bytes,
                self.in_bwd,
            ),
            "param_gather": (self.w, self.block, d.params, d.optim, self.param_bytes, self.in_fwd),
        }

    # -- hooks ---------------------------------------------------------------------------------------

    def make_codecs(self, widths: dict[str, int]) -> PlanCodecs:
        """The codecs of the plan's collectives."""
        return plan_codecs(self.plan, **widths)

    def reductions(
        self, sizes: list[int]
    ) -> tuple[dict[int, tuple[Collective, ...]], dict[int, tuple[Collective, ...]]]:
        """Per unit, the gradient reductions issued after its backward, and the cross-replica reductions
        it issues in the last micro-batch's backward when the schedule runs them there: the engine
        reduces each unit's gradient on its own."""
        reduces = {i: self.reduce(sizes[i]) for i in reversed(range(len(sizes)))}
        return reduces, {i: self.replica(n) for i, n in enumerate(sizes)}

    def prefetch_depths(self, units: list[Unit], reverse: bool) -> list[int]:
        """Units ahead each unit's compute may have gathers in flight for (walk order): the plan's."""
        return [self.plan.prefetch] * len(units)

    def unit_end_param_gather(self, n: int) -> tuple[Collective, ...]:
        """A unit's post-step parameter all-gather when it runs at the step end (not in the forward)."""
        return () if self.in_fwd else self.param_gather(n)

    def extra_step_end(self, sizes: list[int]) -> list[Collective]:
        """Step-end collectives beyond the units' own and the scalars (the engine has none)."""
        return []

    def forward_calls(self, steps: list[UnitSteps], gathered: list[int]) -> list[UnitSteps]:
        """The units' forward gathers as the framework issues them (``gathered``: each unit's gathered
        elements): the engine's are one call per unit, issued ``prefetch`` units ahead (unchanged)."""
        return steps

    # -- building ------------------------------------------------------------------------------------

    def build(
        self,
        units: list[Unit],
        micro_batches: int,
        *,
        padded: bool,
        fp16: bool,
        last_keeps_weights: bool = True,
    ) -> StepSchedule:
        """The step of ``units``. ``last_keeps_weights``: the last forward unit keeps its gathered weights
        for the backward (the cost model's step); False gives every unit a backward gather (what the
        runtime executes per unit, skipping it for a unit still full, :func:`engine_unit_steps`)."""
        sizes = [self.size_of(u.numel, padded) for u in units]
        gathered = [self.size_of(u.gathered, padded) if u.gathered else 0 for u in units]
        reduces, replicas = self.reductions(sizes)
        steps, step_end = self._unit_steps(units, sizes, gathered, reduces, replicas, last_keeps_weights)
        steps = self.forward_calls(steps, gathered)
        step_end.extend(self.extra_step_end(sizes))
        step_end.extend(self._scalars(fp16))
        return StepSchedule(
            tuple(steps), tuple(c for c in step_end if c.bytes_sent), micro_batches, self.options
        )

    def _unit_steps(
        self,
        units: list[Unit],
        sizes: list[int],
        gathered: list[int],
        reduces: dict[int, tuple[Collective, ...]],
        replicas: dict[int, tuple[Collective, ...]],
        last_keeps_weights: bool,
    ) -> tuple[list[UnitSteps], list[Collective]]:
        """Each unit's entry, and the step-end collectives the units leave there (in unit order)."""
        d = self.d
        fdepth = self.prefetch_depths(units, reverse=False)
        bdepth = self.prefetch_depths(units, reverse=True)
        bwd_kind, bwd_size, bwd_codec = self.bwd
        steps: list[UnitSteps] = []
        step_end: list[Collective] = []
        for i, u in enumerate(units):
            N, G = sizes[i], gathered[i]
            keeps = last_keeps_weights and i == len(units) - 1
            fwd = self.gather("forward", "params", d.params, self.codecs.gather, G) if d.params > 1 else ()
            # the last forward unit still holds its weights; with p == 1 every unit does
            regather = not keeps and d.params > 1 and self.backward_gather
            bwd = self.gather("backward", bwd_kind, bwd_size, bwd_codec, G) if regather else ()
            last = replicas[i] if self.in_bwd else ()
            first = self.param_gather(N) if self.in_fwd else ()
            steps.append(
                UnitSteps(
                    u, fwd, bwd, reduces[i], fdepth[i], bdepth[i], last, first, self.replica(N),
                    self.param_gather(N),
                )
            )  # fmt: skip
            if not self.in_bwd:
                step_end.extend(self.replica(N))
            step_end.extend(self.unit_end_param_gather(N))
        return steps, step_end

    def _scalars(self, fp16: bool) -> list[Collective]:
        """The step end's scalar all-reduces: the gradient norm (summing each optimizer shard once, over
        one optimizer group) and, with fp16, the overflow flag over the world."""
        d, w, topology = self.d, self.w, self.topology
        out = []
        if d.optim > 1:
            nbytes = volume.all_reduce_bytes(1, d.optim, 4)
            out.append(
                self.coll("scalar", "all_reduce", "optim", d.optim, nbytes, "fp32", 4, overlappable=False)
            )
        if fp16 and w > 1:
            world_tier = topology.tier_of_group(range(w)) or ""
            nodes = -(-w // topology.devices_per_node)
            nbytes = volume.all_reduce_bytes(1, w, 4)
            out.append(
                self.coll("scalar", "all_reduce", "world", w, nbytes, "fp32", 4, overlappable=False,
                          where=(world_tier, nodes, min(w, topology.devices_per_node)))
            )  # fmt: skip
        return out

    # -- collectives ---------------------------------------------------------------------------------

    def size_of(self, n: int, padded: bool) -> int:
        return padded_numel(n, self.d) if padded else _exact(n, self.d)

    def span(self, kind: str) -> tuple[str, int, int]:
        if kind not in self.spans:
            t, nodes, rpn = group_span(self.topology, self.d, kind)
            self.spans[kind] = (t or "", nodes, rpn)
        return self.spans[kind]

    def coll(self, phase, op, kind, size, nbytes, dtype, message, *, overlappable=True, where=None, quant=0):
        tier, nodes, rpn = where or self.span(kind)
        # the quantizer takes the gathered weights' values (int8) or the reduced gradients' (int4)
        values = (self.reduce_bytes if dtype == "int4" else self.param_bytes) if quant else 4
        return Collective(
            phase, op, kind, size, tier, nbytes, 1, dtype, message, overlappable, nodes, rpn, quant, values
        )

    def _cached(self, name: str, build: Any, *args: Any) -> tuple[Collective, ...]:
        key = (name, *self.context[name], *args)
        if key not in self.memo:
            self.memo[key] = tuple(c for c in build(*args) if c.bytes_sent or c.quant_numel)
        return self.memo[key]

    def gather(self, phase: str, kind: str, size: int, codec: Codec, n: int) -> tuple[Collective, ...]:
        return self._cached("gather", self._gather, phase, kind, size, codec, n)

    def reduce(self, n: int) -> tuple[Collective, ...]:
        return self._cached("reduce", self._reduce, n)

    def replica(self, N: int) -> tuple[Collective, ...]:
        return self._cached("replica", self._replica, N)

    def param_gather(self, N: int) -> tuple[Collective, ...]:
        return self._cached("param_gather", self._param_gather, N)

    def _gather(self, phase: str, kind: str, size: int, codec: Codec, n: int) -> tuple[Collective, ...]:
        block = self.block
        if n == 0:
            return ()
        if size <= 1:
            # a whole-unit int8 secondary (s = 1) sends nothing, but every micro-batch still quantizes
            # the unit into it after the forward and dequantizes it for the backward
            if codec.name not in QUANTIZED:
                return ()
            return (self.coll(phase, codec.gather_op, kind, 1, 0, codec.name, codec.payload(n, block),
                              where=("", 1, 1), quant=2 * n),)  # fmt: skip
        b = codec.gather_bytes(n, size, block)
        if not b:
            return ()
        # a quantized gather quantizes this rank's shard and dequantizes the whole gathered unit
        quant = n + n // size if codec.name in QUANTIZED else 0
        return (
            self.coll(
                phase, codec.gather_op, kind, size, b, codec.name, codec.payload(n, block), quant=quant
            ),
        )

    def _reduce(self, n: int) -> tuple[Collective, ...]:
        d, block, topology = self.d, self.block, self.topology
        if d.grads <= 1 or n == 0:
            return ()
        tier, nodes, rpn = self.span("grads")
        g_intra = _node_share(topology, d)
        if not self.plan.quantize_grads:
            rcodec = self.codecs.reduce
            op, b = rcodec.reduce_op, rcodec.reduce_bytes(n, d.grads, block)
            return (self.coll("grad_reduce", op, "grads", d.grads, b, rcodec.name, rcodec.payload(n, block)),)
        i4 = CODECS["int4"]
        if tier == topology.network.name and g_intra > 1 and d.grads % g_intra == 0:
            g_inter = d.grads // g_intra
            hop1, hop2 = volume.int4_reduce_scatter_2hop_bytes(n, g_intra, g_inter, block)
            intra_tier = topology.tier_of_group(range(g_intra)) or ""
            return (
                self.coll("grad_reduce", i4.reduce_op, "grads_intra", g_intra, hop1, "int4",
                          i4.payload(n, block), where=(intra_tier, 1, g_intra), quant=2 * n),
                self.coll("grad_reduce", i4.reduce_op, "grads_inter", g_inter, hop2, "int4",
                          i4.payload(n // g_intra, block), where=(tier, g_inter, 1), quant=2 * (n // g_intra)),
            )  # fmt: skip
        b = i4.reduce_bytes(n, d.grads, block)
        # the all-to-all reduce-scatter quantizes the whole gradient and dequantizes every received chunk
        return (
            self.coll(
                "grad_reduce", i4.reduce_op, "grads", d.grads, b, "int4", i4.payload(n, block), quant=2 * n
            ),
        )

    def _replica(self, N: int) -> tuple[Collective, ...]:
        # once per step: cross-replica reduction of the gradient shard
        d, w, block, width, gcodec = self.d, self.w, self.block, self.grad_shard_bytes, self.codecs.grad_shard
        out: list[Collective] = []
        if self.plan.grad_reduce == "allreduce":
            k = w // d.grads
            if k > 1:
                b = volume.all_reduce_bytes(N // d.grads, k, width)
                out.append(self.coll("replica_reduce", "all_reduce", "grad_replicas", k, b, gcodec.name,
                                     gcodec.payload(N // d.grads, block), overlappable=self.in_bwd))  # fmt: skip
        else:
            k = d.optim // d.grads
            if k > 1:
                b = volume.reduce_scatter_bytes(N // d.grads, k, width)
                out.append(self.coll("replica_reduce", "reduce_scatter", "optim_scatter", k, b, gcodec.name,
                                     gcodec.payload(N // d.grads, block), overlappable=self.in_bwd))  # fmt: skip
            k = w // d.optim
            if k > 1:
                b = volume.all_reduce_bytes(N // d.optim, k, width)
                out.append(self.coll("replica_reduce", "all_reduce", "optim_replicas", k, b, gcodec.name,
                                     gcodec.payload(N // d.optim, block), overlappable=self.in_bwd))  # fmt: skip
        return tuple(out)

    def _param_gather(self, N: int) -> tuple[Collective, ...]:
        # once per step, after the optimizer: the updated parameters
        d, pcodec = self.d, self.codecs.param
        k = d.optim // d.params
        if k <= 1:
            return ()
        b = volume.all_gather_bytes(N // d.params, k, self.param_bytes)
        return (self.coll("param_gather", "all_gather", "param_gather", k, b, pcodec.name,
                          pcodec.payload(N // d.params, self.block), overlappable=self.in_fwd),)  # fmt: skip


def engine_unit_steps(
    numels: list[int],
    topology: Topology,
    plan: Plan,
    *,
    degrees: Degrees,
    param_bytes: int,
    reduce_bytes: int,
    grad_shard_bytes: int,
) -> list[UnitSteps]:
    """The collectives of each of the engine's units (``numels`` in any order), as the runtime and the
    optimizer execute them: the forward gather, the backward gather (every unit gets one, whichever
    ends the forward: the runtime skips it for a unit still full), the gradient reduction, the
    cross-replica reduction and the post-step parameter gather. The cost model's schedule is built by
    the same builder (:func:`step_schedule`), so what runs is what is costed."""
    units = [Unit(f"unit{i}", n) for i, n in enumerate(numels)]
    widths = {"param_bytes": param_bytes, "reduce_bytes": reduce_bytes, "grad_shard_bytes": grad_shard_bytes}
    b = ScheduleBuilder(topology, plan, degrees, ENGINE, widths, None)
    return list(b.build(units, 1, padded=True, fp16=False, last_keeps_weights=False).units)


ScheduleOptions.builder = ScheduleBuilder
