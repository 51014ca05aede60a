"""Measure collectives on the current backend: ``zerotopo bench collectives`` and ``zerotopo calibrate``.

Both run every group of a kind at once, as training does (each rank is in exactly one group of the
kind), and report the slowest rank's time. Bytes are the ledger's, i.e. :mod:`zerotopo.placement.volume`'s
figures, so *algorithm bandwidth* = bytes this rank sent / time is directly comparable with the cost
model's per-tier bandwidths.

- ``bench``: for every tier, the shard groups of that tier's size (consecutive topological indices:
  pairs of a package, a whole node, the whole job), every requested op and message size.
- ``calibrate``: for every tier, groups that cross *exactly* that tier: the ranks of one tier instance
  that share their position inside the next tier down (a package's two dies; one die of each package of
  a node; one rank per node). A tiny all-gather gives the latency per ring step, a large one the
  bandwidth: ``t = (d-1)·latency + bytes / bandwidth``, the cost model's formula (cost/time.py).

Runs inside a distributed job (srun, torchrun, mpiexec) or, outside one, on local gloo ranks it spawns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from zerotopo import sizes
from zerotopo.comm import collectives as C
from zerotopo.comm import qcollectives as Q
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import GroupHandle, build_mesh, new_group_in_order
from zerotopo.dtypes import PRECISIONS
from zerotopo.errors import ConfigError
from zerotopo.placement import layout
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import Topology, load_topology

OPS = (
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "all_gather_int8",
    "reduce_scatter_int4",
    "reduce_scatter_int4_2hop",
)
DEFAULT_OPS = (
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "all_to_all",
    "all_gather_int8",
    "reduce_scatter_int4",
)
DTYPES = PRECISIONS
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


#: Largest message measured (one buffer per rank of this size is allocated).
MAX_MESSAGE_BYTES = 16 << 30


def parse_size(text: str) -> int:
    """A message size of ``--sizes``: ``4M`` -> 4194304 bytes (:mod:`zerotopo.sizes`), at most
    :data:`MAX_MESSAGE_BYTES`."""
    value = sizes.parse_size(text, key="--sizes", example="64K, 1M, 4M")
    if value > MAX_MESSAGE_BYTES:
        raise ConfigError(
            f"message size {text[:40]!r} is above the limit of {format_size(MAX_MESSAGE_BYTES)}",
            key="--sizes",
        )
    return value


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B" if nbytes < 1024 else f"{nbytes / 1024:.1f}K"


@dataclass(frozen=True)
class BenchSpec:
    """What to measure; picklable, so spawned ranks receive it."""

    topology: str = "emulated"
    nodes: int | None = None
    ops: tuple[str, ...] = DEFAULT_OPS
    sizes: tuple[int, ...] = (64 << 10, 1 << 20, 4 << 20)
    """Message sizes in bytes: the whole buffer (gathered output, reduce-scatter input)."""
    dtype: str = "fp32"
    block: int = 256
    iters: int = 5
    warmup: int = 2
    tiers: tuple[str, ...] = field(default=())
    """Tiers to measure (empty: all)."""


# -- groups -----------------------------------------------------------------------------------------


def tier_groups(
    topology: Topology, rank_of_index: tuple[int, ...], topo_index: int, *, exact: bool
) -> dict[str, GroupHandle]:
    """This rank's group for every tier. ``exact=False``: consecutive blocks of the tier's size (the
    shard groups of that degree). ``exact=True``: ranks of one tier instance sharing their position in
    the next tier down, so the group crosses that tier and nothing slower. Collective: every rank
    creates every group in the same order."""
    world = topology.world_size
    out: dict[str, GroupHandle] = {}
    inner = 1
    for tier in topology.tier_names:
        size = topology.tier_size(tier)
        groups = layout.strided(world, size, inner) if exact else layout.blocks(world, size)
        for members in groups:
            ranks = tuple(rank_of_index[t] for t in members)
            pg, order = new_group_in_order(ranks, local=False) if len(ranks) > 1 else (None, ranks)
            if topo_index in members:
                tier_crossed = topology.tier_of_group(members)
                out[tier] = GroupHandle(tier, ranks, members.index(topo_index), tier_crossed, pg, order)
        inner = size
    return out


# -- timing -----------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_op(
    fn: Callable[[Ledger | None], None], *, iters: int, warmup: int, device: torch.device
) -> tuple[float, int]:
    """(seconds per call of the slowest rank, bytes this rank sent per call, max over ranks)."""
    for _ in range(warmup):
        fn(None)
    _sync(device)
    dist.barrier()
    ledger = Ledger()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(ledger)
    _sync(device)
    seconds = (time.perf_counter() - t0) / iters
    nbytes = sum(r.bytes_sent for r in ledger.records()) // iters
    return _slowest(seconds, device), int(_slowest(float(nbytes), device))


def _op_fn(op: str, g: GroupHandle, numel: int, dtype: torch.dtype, block: int, device: torch.device,
           hops: tuple[GroupHandle, GroupHandle] | None) -> Callable[[Ledger | None], None]:  # fmt: skip
    d = g.size
    full = torch.randn(numel, device=device).to(dtype)
    shard = torch.randn(numel // d, device=device).to(dtype)
    if op == "all_gather":
        return lambda led: C.all_gather(full, shard, g, ledger=led)
    if op == "reduce_scatter":
        return lambda led: C.reduce_scatter(shard, full, g, ledger=led)
    if op == "all_reduce":
        return lambda led: C.all_reduce(full, g, ledger=led)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda led: C.all_to_all(out, full, g, ledger=led)
    if op == "broadcast":
        return lambda led: C.broadcast(full, 0, g, ledger=led)
    if op == "all_gather_int8":
        return lambda led: Q.all_gather_int8(full, shard, g, block=block, ledger=led)
    if op == "reduce_scatter_int4":
        return lambda led: Q.reduce_scatter_int4(shard, full, g, block=block, ledger=led)
    if op == "reduce_scatter_int4_2hop":
        assert hops is not None
        return lambda led: Q.reduce_scatter_int4(
            shard, full, g, block=block, intra=hops[0], inter=hops[1], ledger=led
        )
    raise ConfigError(f"unknown op {op!r}; ops are {', '.join(OPS)}", key="--ops")


def _topology(spec: BenchSpec, world: int) -> Topology:
    topo = load_topology(spec.topology)
    nodes = spec.nodes or max(1, world // topo.devices_per_node)
    return topo.with_nodes(nodes)


def bench_rank(spec: BenchSpec, topo_index: int, hostname: str | None = None) -> list[dict[str, Any]]:
    """Run the benchmark on this rank of an initialised job; every rank returns the same rows."""
    topo = _topology(spec, dist.get_world_size())
    # zero3 puts the gradients over the whole job: its mesh has the hop groups of the two-hop op.
    mesh = build_mesh(topo, get_preset("zero3"), topo_index=topo_index, hostname=hostname)
    groups = tier_groups(topo, mesh.rank_of_index, topo_index, exact=False)
    dtype = DTYPES[spec.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    rows: list[dict[str, Any]] = []
    for tier, g in groups.items():
        if spec.tiers and tier not in spec.tiers:
            continue
        for op in spec.ops:
            hops = None
            if op == "reduce_scatter_int4_2hop":
                if g.ranks != mesh.group("grads").ranks or mesh.group("grads_inter").size == 1:
                    continue  # two hops only where the group spans several nodes
                hops = (mesh.group("grads_intra"), mesh.group("grads_inter"))
            for size in spec.sizes:
                numel = max(g.size, size // elem // g.size * g.size)
                fn = _op_fn(op, g, numel, dtype, spec.block, mesh.device, hops)
                seconds, sent = time_op(fn, iters=spec.iters, warmup=spec.warmup, device=mesh.device)
                rows.append(
                    {
                        "op": op,
                        "degree": g.size,
                        "tier": g.tier or "local",
                        "size_bytes": numel * elem,
                        "dtype": spec.dtype,
                        "seconds": seconds,
                        "bytes_sent": sent,
                        "algbw_gbps": sent / seconds / 1e9 if seconds > 0 else 0.0,
                        "backend": mesh.backend,
                    }
                )
    return rows


# -- running inside a job or on spawned local ranks -------------------------------------------------


def _spawned(rank: int, world: int, spec: BenchSpec) -> Any:
    # Local emulated ranks: rank order is topological order.
    return bench_rank(spec, rank)


def run(spec: BenchSpec, *, ranks: int | None = None, emulate: dict | None = None) -> Any:
    """The collective benchmark (:func:`bench_rank`) in the current job, or on local gloo ranks when
    this process is not part of one (see :func:`run_on_ranks`). ``zerotopo calibrate`` measures with
    :mod:`zerotopo.bench.curves` on the same runner."""
    return run_on_ranks(spec, bench_rank, _spawned, (), ranks=ranks, emulate=emulate)


def run_on_ranks(
    spec: Any,
    rank_fn: Callable[[Any, int], Any],
    spawned: Callable[..., Any],
    spawned_args: tuple = (),
    *,
    ranks: int | None = None,
    emulate: dict | None = None,
) -> Any:
    """``rank_fn(spec, topological index)`` on every rank of the current job, or ``spawned(rank, world,
    *spawned_args, spec)`` on local gloo ranks (whole nodes of ``spec.topology``) when this process is not
    part of one. Returns rank 0's result (``None`` on other ranks of a job). ``emulate``: keywords of
    :func:`zerotopo.launch.netem.emulated_cluster`; the local ranks then run each in its own network namespace
    with every tier shaped (root)."""
    from zerotopo.launch.discovery import discover, init_distributed, topological_index

    info = discover(os.environ)
    if info.world_size > 1 or dist.is_initialized():
        topo = load_topology(spec.topology, nodes=spec.nodes or info.num_nodes)
        init_distributed(info)
        result = rank_fn(replace(spec, nodes=topo.nodes), topological_index(info, topo))
        return result if dist.get_rank() == 0 else None
    from zerotopo.launch.spawn import spawn

    topo = load_topology(spec.topology)
    world = ranks or topo.world_size
    if world % topo.devices_per_node:
        raise ConfigError(
            f"{world} ranks do not fill whole nodes of topology {topo.name!r} "
            f"({topo.devices_per_node} devices per node); use a multiple of {topo.devices_per_node}",
            key="--ranks",
        )
    spec = replace(spec, nodes=world // topo.devices_per_node)

    def go(network: Any = None) -> Any:
        return spawn(spawned, world, args=(*spawned_args, spec), ranks_per_node=topo.devices_per_node,
                     timeout_s=1800, network=network)[0]  # fmt: skip

    if emulate is not None:
        from zerotopo.launch.netem import emulated_cluster

        with emulated_cluster(topo.with_nodes(spec.nodes), **emulate) as net:
            return go(net)
    return go()


def format_table(rows: list[dict[str, Any]]) -> str:
    """The bench rows as an aligned text table."""
    head = f"{'op':<26} {'degree':>6} {'tier':<8} {'size':>7} {'time_us':>11} {'sent':>9} {'algbw_GB/s':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['op']:<26} {r['degree']:>6} {r['tier']:<8} {format_size(r['size_bytes']):>7} "
            f"{r['seconds'] * 1e6:>11.1f} {format_size(r['bytes_sent']):>9} {r['algbw_gbps']:>10.3f}"
        )
    return "\n".join(lines)
