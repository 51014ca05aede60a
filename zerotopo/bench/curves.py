"""Measure the cost model's inputs on this machine: bandwidth curves per span, per-tier alpha-beta
figures and the overlap parameters. ``zerotopo calibrate`` runs it and writes the table.

Spans measured, every group of a span at once (as in training):

- for every tier, the *shard groups* of that tier's size (consecutive topological indices: a package, a
  node, the whole job) — the spans of the params/grads/secondary groups;
- for every tier, the groups that cross *exactly* that tier (one rank per instance of the tier below:
  a package's two dies, one die of each package of a node, one rank per node) — the spans of replica
  groups; these also give the per-tier alpha-beta figures (latency per ring step from the smallest
  message, bandwidth from the largest).

For each span, op and message size: ``busbw = bytes this rank sent / time`` of the slowest rank (the
figure :mod:`zerotopo.cost.bandwidth` divides by). The overlap parameters: the slowdown of a matrix
multiply while an all-gather is in flight (``compute_slowdown``), and whether two collectives on two
groups progress together (``concurrent``: 2 when issuing both at once takes under 3/4 of running them
one after the other, else 1).
"""

from __future__ import annotations

import datetime
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.bench import collectives as bench
from zerotopo.comm.collectives import ALL_GATHER
from zerotopo.comm.mesh import GroupHandle, build_mesh
from zerotopo.errors import ConfigError
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import Topology, load_topology

#: Curve family -> the op this measures it with (zerotopo.bench.collectives names).
MEASURED = {
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_to_all": "all_to_all",
}
DEFAULT_SIZES = (64 << 10, 1 << 20, 16 << 20)


@dataclass(frozen=True)
class MeasureSpec:
    """What to measure; picklable, so spawned ranks receive it."""

    topology: str = "emulated"
    nodes: int | None = None
    ops: tuple[str, ...] = tuple(MEASURED)
    sizes: tuple[int, ...] = DEFAULT_SIZES
    iters: int = 5
    warmup: int = 2
    tiers: tuple[str, ...] = ()
    overlap: bool = True


def _span(topo: Topology, tier: str, exact: bool) -> tuple[int, int]:
    """(nodes, ranks per node) of the groups of ``tier`` (shard groups, or exact-tier groups)."""
    dpn = topo.devices_per_node
    size = topo.tier_size(tier)
    if not exact:
        return max(1, size // dpn), min(size, dpn)
    if tier == topo.network.name:
        return topo.nodes, 1
    names = [t.name for t in topo.tiers]
    return 1, topo.tiers[names.index(tier)].fanout


def _matmul_seconds(n: int, reps: int, device: torch.device) -> float:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    bench._sync(device)
    return time.perf_counter() - t0


def _overlap(g: GroupHandle, other: GroupHandle, size: int, device: torch.device) -> dict[str, float]:
    """Compute slowdown under an in-flight all-gather, and whether two collectives run together."""
    numel = max(g.size, size // 4 // g.size * g.size)
    full = torch.empty(numel, device=device)
    shard = torch.randn(numel // g.size, device=device)
    n, reps = 256, 8
    _matmul_seconds(n, 2, device)  # warm up
    dist.barrier()
    alone = _matmul_seconds(n, reps, device)
    dist.barrier()
    work = ALL_GATHER(full, shard, group=g.pg, async_op=True)
    busy = _matmul_seconds(n, reps, device)
    work.wait()
    slowdown = bench._slowest(max(0.0, busy / alone - 1.0), device)
    # two collectives on two groups: one after the other, then both in flight
    numel2 = max(other.size, size // 4 // other.size * other.size)
    full2 = torch.empty(numel2, device=device)
    shard2 = torch.randn(numel2 // other.size, device=device)

    def both(together: bool) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        w1 = ALL_GATHER(full, shard, group=g.pg, async_op=together)
        if together:
            w2 = ALL_GATHER(full2, shard2, group=other.pg, async_op=True)
            w1.wait()
            w2.wait()
        else:
            ALL_GATHER(full2, shard2, group=other.pg)
        bench._sync(device)
        return bench._slowest(time.perf_counter() - t0, device)

    both(False)
    seq = min(both(False) for _ in range(3))
    par = min(both(True) for _ in range(3))
    return {
        "compute_slowdown": round(min(slowdown, 10.0), 4),
        "concurrent": 2 if par < 0.75 * seq else 1,
        "step_end_overlap": 0.0,
        # on CPU ranks the engine reduces each micro-batch's gradients on the computing thread
        "host_reduce": device.type == "cpu",
    }


def measure_rank(spec: MeasureSpec, topo_index: int, hostname: str | None = None) -> dict[str, Any]:
    """Run the measurements on this rank of an initialised job; every rank returns the same table."""
    topo = load_topology(spec.topology)
    topo = topo.with_nodes(spec.nodes or max(1, dist.get_world_size() // topo.devices_per_node))
    mesh = build_mesh(topo, get_preset("ddp"), topo_index=topo_index, hostname=hostname)
    device = mesh.device
    curves: list[dict[str, Any]] = []
    tiers: dict[str, dict[str, float]] = {}
    seen: set[tuple] = set()
    handles: list[GroupHandle] = []
    for exact in (False, True):
        groups = bench.tier_groups(topo, mesh.rank_of_index, topo_index, exact=exact)
        for tier, g in groups.items():
            if g.size < 2 or (spec.tiers and tier not in spec.tiers):
                continue
            nodes, rpn = _span(topo, tier, exact)
            crossed = g.tier or tier
            # a span measured already (a package's shard group is also the group crossing exactly the
            # package; one node's whole job is its node group) keeps its curves
            fresh = (crossed, nodes, rpn) not in seen
            seen.add((crossed, nodes, rpn))
            if fresh:
                handles.append(g)
            for op in spec.ops if fresh else ():
                if op not in MEASURED:
                    raise ConfigError(
                        f"unknown op {op!r}; calibrate measures {', '.join(MEASURED)}", key="--ops"
                    )
                sizes, bws = [], []
                for size in sorted(spec.sizes):
                    numel = max(g.size, size // 4 // g.size * g.size)
                    fn = bench._op_fn(MEASURED[op], g, numel, torch.float32, 256, device, None)
                    seconds, sent = bench.time_op(fn, iters=spec.iters, warmup=spec.warmup, device=device)
                    if numel * 4 in sizes or seconds <= 0 or sent <= 0:
                        continue
                    sizes.append(numel * 4)
                    bws.append(round(sent / seconds / 1e9, 6))
                if sizes:
                    curves.append(
                        {"op": op, "tier": crossed, "nodes": nodes, "ranks_per_node": rpn, "sizes": sizes,
                         "busbw_gbps": bws}
                    )  # fmt: skip
            if exact:
                # alpha-beta per tier: latency per ring step from one element per rank, bandwidth from
                # the largest message (what the cost model uses where no curve applies)
                small = bench._op_fn("all_gather", g, g.size, torch.float32, 256, device, None)
                t_small, _ = bench.time_op(
                    small, iters=max(spec.iters, 20), warmup=spec.warmup, device=device
                )
                ag = [
                    c
                    for c in curves
                    if c["op"] == "all_gather" and c["tier"] == crossed and c["ranks_per_node"] == rpn
                ]
                entry = {"latency_us": round(t_small / (g.size - 1) * 1e6, 2)}
                if ag:
                    entry["bandwidth_gbps"] = ag[-1]["busbw_gbps"][-1]
                tiers[tier] = entry
    out: dict[str, Any] = {
        "topology": topo.name,
        "nodes": topo.nodes,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "notes": (
            f"measured on {socket.gethostname()} with {mesh.backend} ({dist.get_world_size()} ranks, device "
            f"{device.type}): every group of a span at once, fp32 buffers, {spec.iters} timed calls after "
            f"{spec.warmup}; busbw = bytes one rank sent / time of the slowest rank"
        ),
        "tiers": tiers,
        "bandwidth": curves,
    }
    if spec.overlap and len(handles) >= 2:
        out["overlap"] = _overlap(handles[0], handles[-1], max(spec.sizes), device)
    return out


def _spawned(rank: int, world: int, spec: MeasureSpec) -> Any:
    # Local emulated ranks: rank order is topological order.
    return measure_rank(spec, rank)


def run(spec: MeasureSpec, *, ranks: int | None = None, emulate: dict | None = None) -> dict[str, Any] | None:
    """Measure in the current job, or on local gloo ranks when this process is not part of one.
    Returns rank 0's table (``None`` on other ranks of a job). ``emulate``: keywords of
    :func:`zerotopo.launch.netem.emulated_cluster`; the local ranks then run each in its own network namespace
    with every tier shaped (root)."""
    return bench.run_on_ranks(spec, measure_rank, _spawned, ranks=ranks, emulate=emulate)
