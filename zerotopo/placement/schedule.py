"""The per-unit communication schedule of a training step, as data.

[Note: schedule as data] A step is, per micro-batch and per *unit* (what one all-gather fetches: the
engine's flat units — embedding, each layer, head — or DeepSpeed's per-module parameters), a list of
collectives:

- ``forward``: gathers issued before the unit's forward compute;
- ``backward``: gathers issued before the unit's backward compute (none for the last forward unit,
  which keeps its weights for the backward that follows at once);
- ``reduce``: gradient reductions issued after the unit's backward compute (every unit for the engine;
  for bucketed reductions, only the unit that fills a bucket, and the last one with the remainder);

and, once per step, the ``step_end`` collectives (post-step parameter all-gather, scalar all-reduces;
the cross-replica gradient reduction too unless it runs in the backward) that run after the last
backward and never overlap compute. With :attr:`ScheduleOptions.step_end_in_backward` (the engine's
``set_is_last_backward``) each unit's cross-replica reduction is its ``last_reduce``: issued in the last
micro-batch's backward right after the unit's own reduction, beside the rest of the backward. With
:attr:`ScheduleOptions.param_gather_in_forward` (the engine's lazy parameter gather) a sharded unit's
post-step parameter all-gather is its ``first_forward``: in flight from the start of the (next) step's
first micro-batch, and waited for by the unit's first forward gather.

Each :class:`Collective` carries its phase, ledger op, group kind and size, the tier it crosses and the
group's span (nodes, ranks per node), its codec, the bytes one rank sends (the ledger's count), the
whole message's bytes (what a bandwidth table is indexed by) and whether it can overlap compute.
:meth:`StepSchedule.collectives` merges identical calls into counts: the list
:func:`zerotopo.cost.comm.comm_per_step` returns and the runtime ledger is compared with. The time
model (:mod:`zerotopo.cost.time`) walks the per-unit lists; the engine executes them
(:func:`engine_unit_steps`: the runtime and the optimizer run each unit's entries).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from zerotopo.placement import volume
from zerotopo.placement.codecs import CODECS, Codec, plan_codecs
from zerotopo.placement.layout import groups, padded_numel
from zerotopo.placement.plan import Degrees, Plan
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

PHASES = ("forward", "backward", "grad_reduce", "replica_reduce", "param_gather", "scalar")
#: Phases that repeat every micro-batch (the rest run once per step).
MICRO_BATCH_PHASES = ("forward", "backward", "grad_reduce")
GRANULARITIES = ("unit", "module")


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
    """``embedding``, ``layer``, ``head`` (engine units) or ``layer.qkv`` ... (DeepSpeed modules)."""
    numel: int
    """Parameters of the unit (its gradient elements)."""
    gather_numel: int | None = None
    """Parameters gathered (None: all; DeepSpeed keeps parameters below its persistence threshold
    whole on every rank)."""
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


@dataclass(frozen=True)
class ScheduleOptions:
    """How the schedule cuts the model and batches its collectives (the schedule's knobs)."""

    name: str = "zerotopo"
    granularity: str = "unit"
    """``unit``: the engine's flat units (embedding, each layer, head), one gather and one reduction each;
    ``module``: one gather per weight matrix, as DeepSpeed ZeRO-3 fetches submodules."""
    reduce_bucket_elems: int | None = None
    """Gradient elements per reduction (DeepSpeed ``reduce_bucket_size``); None: one per unit."""
    prefetch_bucket_elems: int | None = None
    """Elements gathered ahead (DeepSpeed ``stage3_prefetch_bucket_size``); None: ``plan.prefetch`` units."""
    persistence_threshold: int = 0
    """Parameters with fewer elements stay whole on every rank and are never gathered (DeepSpeed
    ``stage3_param_persistence_threshold``)."""
    unit_layers: int = 1
    """Layers per unit with the ``unit`` granularity (the engine runs 1)."""
    step_end_in_backward: bool = True
    """Each unit's cross-replica gradient reduction starts in the last micro-batch's backward, once its
    gradient shard is final (the engine with ``set_is_last_backward``, as ``zerotopo train`` runs it);
    False: all of them after the backward (DeepSpeed's step)."""
    param_gather_in_forward: bool = True
    """A sharded unit's post-step parameter all-gather stays in flight into the next step's first forward
    (the engine's lazy parameter gather); False: at the end of the step (DeepSpeed)."""
    secondary_param_dtype: bool = False
    """A plain secondary partition keeps the parameters' width (DeepSpeed's hpZ copy); False: bf16 (the
    engine's)."""
    allgather_bucket_elems: int | None = None
    """Parameter elements per post-step all-gather call (DeepSpeed ZeRO-1/2 ``allgather_bucket_size``,
    each call gathering that many elements); None: one call per unit."""
    reduce_scatter_all_reduce: bool = False
    """The gradient reduce-scatter runs as a full all-reduce: a framework that calls torch's
    ``reduce_scatter_tensor`` on gloo, which implements it so (torch 2.13: 8 ranks sent 14.0 times the
    message, an all-reduce's ``2(d-1)/d`` each, where a ring reduce-scatter sends 7.0; DeepSpeed on CPU
    ranks). The engine runs its own ring there ([Note: gloo reduce-scatter] in
    :mod:`zerotopo.comm.collectives`), so its schedules keep False."""
    backward_gather: bool = True
    """A sharded unit is gathered again before its backward; False: the forward's gathered weights stay
    until the backward (DeepSpeed stage 3 on the bench: its coordinator keeps every parameter its
    prefetcher fetched until the parameter's last use, so after the first step nothing is gathered in
    the backward; :func:`zerotopo.bench.compare.framework_cost`)."""
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {', '.join(GRANULARITIES)}, got {self.granularity!r}"
            )
        if not isinstance(self.unit_layers, int) or self.unit_layers < 1:
            raise ValueError(f"unit_layers must be a positive integer, got {self.unit_layers!r}")
        for k in ("reduce_bucket_elems", "prefetch_bucket_elems", "allgather_bucket_elems"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{k} must be a positive integer or None, got {v!r}")


ENGINE = ScheduleOptions()


@dataclass(frozen=True)
class StepSchedule:
    """Every collective of one step, per unit and micro-batch, then the step end."""

    units: tuple[UnitSteps, ...]
    """Forward order; the backward walks them in reverse."""
    step_end: tuple[Collective, ...]
    micro_batches: int
    options: ScheduleOptions = ENGINE

    def collectives(self) -> list[Collective]:
        """Identical calls merged: ``count`` says how many run per step (the ledger's view)."""
        # count by object first (units of one size share their collectives), then merge equal ones
        by_id: dict[int, list] = {}
        for u in self.units:
            for c in u.forward + u.backward + u.reduce:
                by_id.setdefault(id(c), [c, 0])[1] += self.micro_batches
        for c in [*(c for u in self.units for c in u.last_reduce + u.first_forward), *self.step_end]:
            by_id.setdefault(id(c), [c, 0])[1] += 1
        acc: Counter[Collective] = Counter()
        first: dict[Collective, Collective] = {}
        for c, n in by_id.values():
            acc[c] += n
            first.setdefault(c, c)
        out = [_with_count(first[c], n) for c, n in acc.items()]
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


def module_units(shape: ModelShape, persistence_threshold: int = 0) -> list[Unit]:
    """One unit per weight matrix, as DeepSpeed ZeRO-3 gathers submodules: per layer the QKV projection,
    the attention output and each MLP matrix (two, or three when gated); biases and norms ride along with
    the next weight matrix and are gathered unless below ``persistence_threshold`` elements (then never
    gathered). Parameters and FLOPs come from the shape's unit description."""
    seq = shape.seq_length
    layer = shape.layer_unit()
    attention_f = seq * shape.attention_flops()

    def unit(name: str, params: list[int], matmul: int, extra: float = 0.0) -> Unit:
        gathered = sum(p for p in params if p >= persistence_threshold)
        return Unit(name, sum(params), gathered, 2.0 * seq * matmul + extra)

    by_module: dict[str, list] = {}
    for p in layer.params:
        by_module.setdefault(p.module, []).append(p)
    # each norm (weight and bias as one) rides with the matrix that reads its output
    mlp = [m for m in by_module if m.startswith("mlp.")]
    norm_of = {"attention.query_key_value": "input_layernorm", mlp[0]: "post_attention_layernorm"}
    units = []
    for module, params in by_module.items():
        if module.endswith("layernorm"):
            continue
        sizes = [p.numel for p in params]
        if module in norm_of:
            sizes.append(sum(p.numel for p in by_module[norm_of[module]]))
        matmul = sum(p.numel for p in params if p.matmul)
        # attention scores and context (the s²h term) run between QKV and the output projection
        extra = attention_f if module == "attention.query_key_value" else 0.0
        units.append(unit(_MODULE_UNIT_NAMES.get(module, module), sizes, matmul, extra))
    head = shape.head_unit()
    emb = shape.embedding_params()
    head_f = seq * head.flops_per_token
    head_params = [sum(p.numel for p in head.params if not p.matmul)] + [
        p.numel for p in head.params if p.matmul
    ]
    return (
        [Unit("embedding", emb, emb if emb >= persistence_threshold else 0)]
        + units * shape.num_layers
        + [unit("head", head_params, 0, head_f)]
    )


_MODULE_UNIT_NAMES = {
    "attention.query_key_value": "layer.qkv",
    "attention.dense": "layer.dense",
    "mlp.dense_h_to_4h": "layer.mlp_in",
    "mlp.dense_4h_to_h": "layer.mlp_out",
    "mlp.w1": "layer.mlp_in",
    "mlp.w3": "layer.mlp_up",
    "mlp.w2": "layer.mlp_out",
}


# -- the schedule ------------------------------------------------------------------------------------


def _exact(n: int, d: Degrees) -> int:
    unit = math.lcm(d.params, d.grads, d.optim, d.secondary or 1)
    if n % unit:
        raise ValueError(
            f"a unit of {n} elements does not split evenly over degrees {d}; use padded=True "
            f"or a multiple of {unit}"
        )
    return n


def _prefetch_depths(units: list[Unit], plan: Plan, options: ScheduleOptions, reverse: bool) -> list[int]:
    """Units ahead each unit's compute may have gathers in flight for (walk order)."""
    order = units[::-1] if reverse else units
    if options.prefetch_bucket_elems is None:
        return [plan.prefetch] * len(order)
    out = []
    for i in range(len(order)):
        k, inflight = 0, 0
        # DeepSpeed issues prefetches while the elements in flight stay under the bucket (at least one)
        for u in order[i + 1 :]:
            if k >= 1 and inflight + u.gathered > options.prefetch_bucket_elems:
                break
            k += 1
            inflight += u.gathered
        out.append(k)
    return out[::-1] if reverse else out


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
    options: ScheduleOptions = ENGINE,
    degrees: Degrees | None = None,
    shared: dict | None = None,
) -> StepSchedule:
    """The schedule of one step of ``plan`` (see the module note).

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
    b = _Collectives(topology, plan, degrees or plan.degrees(topology), options, widths, shared)
    sizes = [b.size_of(u.numel, padded) for u in units]
    gathered = [b.size_of(u.gathered, padded) if u.gathered else 0 for u in units]
    reduces, bucket_replicas = _reductions(b, sizes)
    steps, step_end = _unit_steps(b, units, sizes, gathered, reduces, bucket_replicas)
    step_end.extend(_bucketed_param_gathers(b, sizes))
    step_end.extend(_scalars(b, fp16))
    return StepSchedule(tuple(steps), tuple(c for c in step_end if c.bytes_sent), micro_batches, options)


class _Collectives:
    """The collectives one schedule is made of, each built once for the arguments it depends on (in the
    memo a planner shares over its candidates, see :func:`step_schedule`'s ``shared``)."""

    def __init__(
        self,
        topology: Topology,
        plan: Plan,
        d: Degrees,
        options: ScheduleOptions,
        widths: dict[str, int],
        shared: dict | None,
    ) -> None:
        self.topology, self.plan, self.d, self.options = topology, plan, d, options
        self.block, self.w = plan.quant_block, d.world
        self.param_bytes, self.grad_shard_bytes = widths["param_bytes"], widths["grad_shard_bytes"]
        self.reduce_bytes = widths["reduce_bytes"]
        self.codecs = plan_codecs(plan, **widths, secondary_param_width=options.secondary_param_dtype)
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
            "reduce": (
                self.w,
                self.block,
                d.grads,
                plan.quantize_grads,
                widths["reduce_bytes"],
                options.reduce_scatter_all_reduce,
            ),
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
            if self.options.reduce_scatter_all_reduce and op == "reduce_scatter":
                op, b = "all_reduce", 2 * b  # an all-reduce: the reduce-scatter's bytes, then as many again
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


def _reductions(
    b: _Collectives, sizes: list[int]
) -> tuple[dict[int, tuple[Collective, ...]], dict[int, tuple[Collective, ...]]]:
    """Per unit, the gradient reductions issued after its backward, and (bucketed only) the cross-replica
    reductions of the buckets it closes.

    The backward walks the units in reverse: reductions (bucketed or not) follow that order. The
    cross-replica reduction in the last backward is per unit, or per bucket beside the bucket's own
    reduction (DeepSpeed ZeRO-1/2 reduce their buckets at the accumulation boundary, MiCS all-reduces
    each bucket's shard across replicas after reducing it within the group)."""
    limit = b.options.reduce_bucket_elems
    reduces: dict[int, tuple[Collective, ...]] = {}
    bucket_replicas: dict[int, tuple[Collective, ...]] = {}
    bucket = 0
    for i in reversed(range(len(sizes))):
        if limit is None:
            reduces[i] = b.reduce(sizes[i])
            continue
        # DeepSpeed reduces the bucket before a gradient that would overflow it joins, and the
        # remainder after the last one
        out: tuple[Collective, ...] = ()
        rep: tuple[Collective, ...] = ()
        if bucket and bucket + sizes[i] > limit:
            out, rep, bucket = b.reduce(bucket), b.replica(bucket), 0
        bucket += sizes[i]
        if i == 0:
            out, rep, bucket = out + b.reduce(bucket), rep + b.replica(bucket), 0
        reduces[i] = out
        bucket_replicas[i] = rep
    return reduces, bucket_replicas


def _bucketed_param_gathers(b: _Collectives, sizes: list[int]) -> list[Collective]:
    """The post-step parameter all-gather at the step end in calls of ``allgather_bucket_elems``
    elements (none unless the options bucket it)."""
    if b.options.allgather_bucket_elems is None or b.in_fwd:
        return []
    total = sum(sizes)
    k = max(1, b.d.optim // b.d.params)
    per = -(-b.options.allgather_bucket_elems // k) * k  # whole per-rank chunks
    full, rest = divmod(total, per)
    return [*b.param_gather(per) * full, *(b.param_gather(rest) if rest else ())]


def _unit_steps(
    b: _Collectives,
    units: list[Unit],
    sizes: list[int],
    gathered: list[int],
    reduces: dict[int, tuple[Collective, ...]],
    bucket_replicas: dict[int, tuple[Collective, ...]],
) -> tuple[list[UnitSteps], list[Collective]]:
    """Each unit's entry, and the step-end collectives the units leave there (in unit order)."""
    d, options = b.d, b.options
    fdepth = _prefetch_depths(units, b.plan, options, reverse=False)
    bdepth = _prefetch_depths(units, b.plan, options, reverse=True)
    bwd_kind, bwd_size, bwd_codec = b.bwd
    steps: list[UnitSteps] = []
    step_end: list[Collective] = []
    for i, u in enumerate(units):
        N, G = sizes[i], gathered[i]
        is_last = i == len(units) - 1
        fwd = b.gather("forward", "params", d.params, b.codecs.gather, G) if d.params > 1 else ()
        # the last forward unit still holds its weights; with p == 1 every unit does
        regather = not is_last and d.params > 1 and options.backward_gather
        bwd = b.gather("backward", bwd_kind, bwd_size, bwd_codec, G) if regather else ()
        last = (bucket_replicas[i] if bucket_replicas else b.replica(N)) if b.in_bwd else ()
        first = b.param_gather(N) if b.in_fwd else ()
        steps.append(
            UnitSteps(
                u, fwd, bwd, reduces[i], fdepth[i], bdepth[i], last, first, b.replica(N), b.param_gather(N)
            )
        )
        if not b.in_bwd:
            step_end.extend(b.replica(N))
        if not b.in_fwd and options.allgather_bucket_elems is None:
            step_end.extend(b.param_gather(N))
    return steps, step_end


def _scalars(b: _Collectives, fp16: bool) -> list[Collective]:
    """The step end's scalar all-reduces: the gradient norm (summing each optimizer shard once, over one
    optimizer group) and, with fp16, the overflow flag over the world."""
    d, w, topology = b.d, b.w, b.topology
    out = []
    if d.optim > 1:
        nbytes = volume.all_reduce_bytes(1, d.optim, 4)
        out.append(b.coll("scalar", "all_reduce", "optim", d.optim, nbytes, "fp32", 4, overlappable=False))
    if fp16 and w > 1:
        world_tier = topology.tier_of_group(range(w)) or ""
        nodes = -(-w // topology.devices_per_node)
        nbytes = volume.all_reduce_bytes(1, w, 4)
        out.append(
            b.coll("scalar", "all_reduce", "world", w, nbytes, "fp32", 4, overlappable=False,
                   where=(world_tier, nodes, min(w, topology.devices_per_node)))
        )  # fmt: skip
    return out


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
    the same function (:func:`step_schedule`), so what runs is what is costed."""
    units = [Unit(f"unit{i}", n) for i, n in enumerate(numels)] + [Unit("end", 0)]  # every real unit non-last
    sched = step_schedule(
        units, topology, plan, micro_batches=1, param_bytes=param_bytes, reduce_bytes=reduce_bytes,
        grad_shard_bytes=grad_shard_bytes, degrees=degrees,
    )  # fmt: skip
    return list(sched.units[: len(numels)])
