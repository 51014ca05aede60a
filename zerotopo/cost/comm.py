"""Bytes per step: every collective the engine issues for a plan, its group, the tier it crosses.

[Note: counted schedule] Per unit (embedding, each layer, head; ``n`` elements padded by
:func:`zerotopo.layout.padded_numel`) and per micro-batch:

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

All byte counts come from :mod:`zerotopo.comm.volume`, the functions the runtime ledger uses, so the two
agree byte for byte. A collective over a group of one rank moves nothing and is not listed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from zerotopo.comm import volume
from zerotopo.cost.memory import grad_widths
from zerotopo.layout import groups, padded_numel
from zerotopo.plan import Degrees, Plan
from zerotopo.topology import Topology

PHASES = ("forward", "backward", "grad_reduce", "replica_reduce", "param_gather", "scalar")
#: Phases that repeat every micro-batch (the rest run once per step).
MICRO_BATCH_PHASES = ("forward", "backward", "grad_reduce")


@dataclass(frozen=True)
class CollectiveCost:
    """One kind of collective in a step: what it is, where it runs and how often."""

    phase: str
    """``forward``, ``backward``, ``grad_reduce``, ``replica_reduce``, ``param_gather`` or ``scalar``."""
    op: str
    """As the runtime ledger names it: ``all_gather``, ``all_gather_int8``, ``reduce_scatter``,
    ``reduce_scatter_int4`` (the all-to-all based one, each hop of the two-hop form) or ``all_reduce``."""
    group: str
    """Group kind (:func:`zerotopo.layout.groups`); ``grads_intra``/``grads_inter`` for the hops of the
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
    """Payload: ``bf16``/``fp16``/``fp32`` (by byte width) or ``int8``/``int4``."""

    @property
    def total_bytes(self) -> int:
        """Bytes one rank sends in all calls of the step."""
        return self.bytes_sent * self.count

    @property
    def latency_steps(self) -> int:
        """Message steps of the ring algorithm: ``d-1``, twice that for an all-reduce."""
        return (2 if self.op == "all_reduce" else 1) * (self.group_size - 1)


#: Op names as the runtime ledger records them (zerotopo.comm.collectives / qcollectives).
INT8_AG = "all_gather_int8"
INT4_RS = "reduce_scatter_int4"


def _gather_op(dtype: str) -> str:
    return INT8_AG if dtype == "int8" else "all_gather"


def _dtype_name(elem_bytes: int) -> str:
    return {1: "int8", 2: "bf16", 4: "fp32"}.get(elem_bytes, f"{8 * elem_bytes}bit")


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


_TIER_CACHE: dict[tuple, str | None] = {}


def group_tier(topology: Topology, d: Degrees, kind: str) -> str | None:
    """The outermost tier any group of ``kind`` crosses (None when the groups are single ranks)."""
    fields = _KIND_FIELDS[kind]
    vals = tuple(getattr(d, f) for f in fields)
    key = (topology, kind, d.world, vals)
    if key in _TIER_CACHE:
        return _TIER_CACHE[key]
    # a canonical Degrees with only what ``kind`` depends on: plans share cache entries
    named = dict(zip(fields, vals))
    canon = Degrees(
        params=named.get("params", 1),
        grads=named.get("grads", named.get("params", 1)),
        optim=named.get("optim", named.get("grads", 1)),
        world=d.world,
        secondary=named.get("secondary"),
    )
    if len(_TIER_CACHE) > 1 << 16:
        _TIER_CACHE.clear()
    _TIER_CACHE[key] = tier = _group_tier(topology, canon, kind)
    return tier


@lru_cache(maxsize=4096)
def _group_tier(topology: Topology, d: Degrees, kind: str) -> str | None:
    """The outermost tier any group of ``kind`` crosses.

    Tier-aligned degrees give congruent groups, so every group crosses the same tier as rank 0's; for
    other degrees (12 ranks over 8-device nodes) the slowest group bounds the collective, so take the
    outermost tier over all groups.
    """
    order = {name: i for i, name in enumerate(topology.tier_names)}
    worst: str | None = None
    for g in groups(d, kind):
        t = topology.tier_of_group(g)
        if t is not None and (worst is None or order[t] > order[worst]):
            worst = t
    return worst


def _node_share(topology: Topology, d: Degrees) -> int:
    """Ranks of rank 0's gradient group that sit in its node (the first hop of a two-hop all-to-all)."""
    return min(d.grads, topology.devices_per_node)


def _ordered_units(unit_numels: list[int]) -> tuple[Counter[int], int]:
    """The units as (multiset of all but the last, last): layers repeat, so cost each size once."""
    if not unit_numels:
        raise ValueError("a model needs at least one unit")
    for n in unit_numels:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"unit element counts must be non-negative integers, got {n!r}")
    return Counter(unit_numels[:-1]), unit_numels[-1]


def _exact(n: int, d: Degrees) -> int:
    unit = math.lcm(d.params, d.grads, d.optim, d.secondary or 1)
    if n % unit:
        raise ValueError(
            f"a unit of {n} elements does not split evenly over degrees {d}; use padded=True "
            f"or a multiple of {unit}"
        )
    return n


def comm_per_step(
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
) -> list[CollectiveCost]:
    """Every collective of one training step with ``micro_batches`` micro-batches (see the module note).

    ``param_bytes`` is the width of the gathered weights, ``reduce_bytes`` that of the per-micro-batch
    gradient reduce-scatter and ``grad_shard_bytes`` that of the accumulated gradient shard reduced once
    per step (fp32 in the engine; the papers' fp16 tables use 2). With ``padded=False`` units are not
    padded, so every count must split evenly over the groups (as the papers' closed forms assume).
    Identical collectives are merged: ``count`` says how many run per step. Unset widths follow the
    plan's ``grad_dtype`` (:func:`zerotopo.cost.memory.grad_widths`: 4 bytes unless it is ``param``).
    """
    gb, rb = grad_widths(plan, param_bytes)
    reduce_bytes = rb if reduce_bytes is None else reduce_bytes
    grad_shard_bytes = gb if grad_shard_bytes is None else grad_shard_bytes
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    return _comm(
        unit_numels,
        topology,
        plan,
        plan.degrees(topology),
        micro_batches,
        param_bytes,
        reduce_bytes,
        grad_shard_bytes,
        padded,
        fp16,
    )


def _comm(
    unit_numels: list[int],
    topology: Topology,
    plan: Plan,
    d: Degrees,
    micro_batches: int,
    param_bytes: int,
    reduce_bytes: int,
    grad_shard_bytes: int,
    padded: bool,
    fp16: bool,
) -> list[CollectiveCost]:
    """:func:`comm_per_step` on already resolved degrees (the planner resolves each plan once)."""
    rest, last = _ordered_units(unit_numels)
    tiers: dict[str, str] = {}
    acc: Counter[tuple] = Counter()

    def add(phase, op, kind, size, tier, nbytes, count, dtype):
        if size > 1 and nbytes > 0 and count > 0:
            acc[(phase, op, kind, size, tier, nbytes, dtype)] += count

    def tier(kind: str) -> str:
        if kind not in tiers:
            tiers[kind] = group_tier(topology, d, kind) or ""
        return tiers[kind]

    M = micro_batches
    block = plan.quant_block
    w = d.world
    pdt, rdt, gs = _dtype_name(param_bytes), _dtype_name(reduce_bytes), _dtype_name(grad_shard_bytes)
    for n, mult, is_last in [(n, k, False) for n, k in rest.items()] + [(last, 1, True)]:
        N = padded_numel(n, d) if padded else _exact(n, d)
        # forward: gather the primary partition
        if d.params > 1:
            if plan.quantize_weights:
                b, dt = volume.int8_all_gather_bytes(N, d.params, block), "int8"
            else:
                b, dt = volume.all_gather_bytes(N, d.params, param_bytes), pdt
            add("forward", _gather_op(dt), "params", d.params, tier("params"), b, M * mult, dt)
        # backward: the last forward unit still holds its weights; with p == 1 every unit does (the full
        # weight is the rank's own shard, never freed), so nothing is gathered, secondary or not
        if not is_last and d.params > 1:
            if d.secondary is not None:
                s = d.secondary
                if plan.secondary_dtype == "int8":
                    b, dt = volume.int8_all_gather_bytes(N, s, block), "int8"
                else:
                    b, dt = volume.all_gather_bytes(N, s, 2), "bf16"
                add("backward", _gather_op(dt), "secondary", s, tier("secondary"), b, M * mult, dt)
            else:
                if plan.quantize_weights:
                    b, dt = volume.int8_all_gather_bytes(N, d.params, block), "int8"
                else:
                    b, dt = volume.all_gather_bytes(N, d.params, param_bytes), pdt
                add("backward", _gather_op(dt), "params", d.params, tier("params"), b, M * mult, dt)
        # gradient reduce-scatter, every micro-batch
        if d.grads > 1:
            gtier = tier("grads")
            g_intra = _node_share(topology, d)
            if not plan.quantize_grads:
                b = volume.reduce_scatter_bytes(N, d.grads, reduce_bytes)
                add("grad_reduce", "reduce_scatter", "grads", d.grads, gtier, b, M * mult, rdt)
            elif gtier == topology.network.name and g_intra > 1 and d.grads % g_intra == 0:
                g_inter = d.grads // g_intra
                hop1, hop2 = volume.int4_reduce_scatter_2hop_bytes(N, g_intra, g_inter, block)
                intra_tier = topology.tier_of_group(range(g_intra)) or ""
                add("grad_reduce", INT4_RS, "grads_intra", g_intra, intra_tier, hop1, M * mult, "int4")
                add("grad_reduce", INT4_RS, "grads_inter", g_inter, gtier, hop2, M * mult, "int4")
            else:
                b = volume.int4_reduce_scatter_bytes(N, d.grads, block)
                add("grad_reduce", INT4_RS, "grads", d.grads, gtier, b, M * mult, "int4")
        # once per step: cross-replica reduction of the gradient shard, then the updated parameters
        if plan.grad_reduce == "allreduce":
            k = w // d.grads
            b = volume.all_reduce_bytes(N // d.grads, k, grad_shard_bytes)
            add("replica_reduce", "all_reduce", "grad_replicas", k, tier("grad_replicas"), b, mult, gs)
        else:
            k = d.optim // d.grads
            b = volume.reduce_scatter_bytes(N // d.grads, k, grad_shard_bytes)
            add("replica_reduce", "reduce_scatter", "optim_scatter", k, tier("optim_scatter"), b, mult, gs)
            k = w // d.optim
            b = volume.all_reduce_bytes(N // d.optim, k, grad_shard_bytes)
            add("replica_reduce", "all_reduce", "optim_replicas", k, tier("optim_replicas"), b, mult, gs)
        k = d.optim // d.params
        b = volume.all_gather_bytes(N // d.params, k, param_bytes)
        add("param_gather", "all_gather", "param_gather", k, tier("param_gather"), b, mult, pdt)
    # the gradient norm sums each optimizer shard once: over one optimizer group
    b = volume.all_reduce_bytes(1, d.optim, 4)
    add("scalar", "all_reduce", "optim", d.optim, tier("optim"), b, 1, "fp32")
    if fp16:
        world_tier = topology.tier_of_group(range(w)) or ""
        add("scalar", "all_reduce", "world", w, world_tier, volume.all_reduce_bytes(1, w, 4), 1, "fp32")
    out = [
        CollectiveCost(phase, op, kind, size, t, nbytes, count, dt)
        for (phase, op, kind, size, t, nbytes, dt), count in acc.items()
    ]
    return sorted(out, key=lambda c: (PHASES.index(c.phase), c.op, c.group, c.group_size, c.bytes_sent))


def edge_costs(unit_numels: list[int], topology: Topology, plan: Plan, **kwargs) -> list[CollectiveCost]:
    """The first forward unit's collectives for one micro-batch: its forward all-gather opens the step
    and its gradient reduce-scatter closes the backward, so the time model keeps both exposed."""
    kwargs["micro_batches"] = 1
    one = comm_per_step(unit_numels[:1], topology, plan, **kwargs)
    return [c for c in one if c.phase in ("forward", "grad_reduce")]


def _edge(
    unit_numels, topology, plan, d, param_bytes, reduce_bytes, fp16, grad_shard_bytes=4
) -> list[CollectiveCost]:
    one = _comm(
        unit_numels[:1], topology, plan, d, 1, param_bytes, reduce_bytes, grad_shard_bytes, True, fp16
    )
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
