"""gloo's own collectives beside the engine's, on the emulated cluster with node uplinks, with the cost
model's figure for each.

    python benchmarks/gloo_collectives.py [--network-mbit 68.5]   (root: it builds network namespaces)

8 ranks of the ``emulated-frontier`` topology (2 nodes of 4), each node's ranks behind one shared uplink
(``--network-mbit`` per rank, 4x that per node, inner tiers at Frontier's ratios): torch's gloo
``all_gather_single``, ``reduce_scatter_single`` (what DeepSpeed calls by their deprecated names,
``all_gather_into_tensor`` and ``reduce_scatter_tensor``) and ``all_reduce``, and the engine's all-gather
and ring reduce-scatter (zerotopo.comm.collectives), on bf16 messages of 0.44 MB and 3.92 MB (a DeepSpeed
prefetch bucket and reduce bucket of ``bench compare``'s default regime). Prints the median of 3 timed
calls (barrier to barrier) and the cost model's time on the regime's links (gloo's reduce-scatter priced
as an all-reduce). gloo runs
the reduce-scatter as a full all-reduce, which is why the engine runs its own ring on gloo and why
``bench compare`` prices DeepSpeed's gradient reductions as all-reduces.
"""

from __future__ import annotations

import argparse
import statistics
import time

SIZES = (220_000, 1_960_000)  # bf16 elements
RANKS_PER_NODE = 4


def _ops(n: int, world: int, group) -> dict:
    """The calls timed on a message of ``n`` bf16 elements: torch's on the default group, the engine's
    (those ``bench compare``'s transport probe times) on ``group``."""
    import torch
    import torch.distributed as dist

    from zerotopo.comm import collectives as C
    from zerotopo_lab.bench.transport import engine_ops

    x = torch.ones(n, dtype=torch.bfloat16)
    shard, full = torch.empty(n // world, dtype=x.dtype), torch.empty(n, dtype=x.dtype)
    return {
        "gloo all_gather": lambda: C.ALL_GATHER(full, x[: n // world]),
        "gloo reduce_scatter": lambda: C.REDUCE_SCATTER(shard, x),
        "gloo all_reduce": lambda: dist.all_reduce(x),
        **{f"engine {op}": call for op, (call, _) in engine_ops(n, world, group).items()},
    }


def _worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from zerotopo.comm.mesh import build_mesh
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated-frontier"), get_preset("zero3"), topo_index=rank)
    out = {}
    for n in SIZES:
        for name, fn in _ops(n, world, mesh.group("grads")).items():
            times = []
            for i in range(4):  # one warm-up call
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                dist.barrier()
                if i:
                    times.append(time.perf_counter() - t0)
            out[(name, n)] = statistics.median(times)
    return out


def _model_seconds(name: str, n: int, world: int, topo) -> float:
    from zerotopo.cost.time import collective_time
    from zerotopo.placement import volume
    from zerotopo.placement.schedule import Collective

    # gloo's reduce-scatter is priced as the all-reduce it runs (as bench compare prices DeepSpeed's)
    kind, op = name.split(" ", 1)
    if (kind, op) == ("gloo", "reduce_scatter"):
        op = "all_reduce"
    sent = {"all_reduce": volume.all_reduce_bytes, "all_gather": volume.all_gather_bytes,
            "reduce_scatter": volume.reduce_scatter_bytes}[op](n, world, 2)  # fmt: skip
    nodes = world // RANKS_PER_NODE
    c = Collective(
        "grad_reduce", op, "grads", world, "network", sent, 1, "bf16", 2 * n, True, nodes, RANKS_PER_NODE, 0
    )
    return collective_time(c, topo)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--network-mbit", type=float, default=68.5, help="network tier rate per rank (Mbit/s)")
    args = p.parse_args()
    from zerotopo.launch.netem import emulated_cluster
    from zerotopo.launch.spawn import spawn
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.regime import emulated_topology

    topo = load_topology("emulated-frontier")
    with emulated_cluster(topo, network_mbit=args.network_mbit, node_uplink=True) as net:
        print(f"tiers {net.tier_rates_mbit} Mbit/s per rank, uplink {net.node_uplink_mbit} Mbit/s per node")
        res = spawn(
            _worker, topo.world_size, ranks_per_node=topo.devices_per_node, network=net, timeout_s=900
        )[0]
    priced = emulated_topology(topo, args.network_mbit, topo.device.peak_tflops * 1e12)
    for (name, n), t in res.items():
        model = _model_seconds(name, n, topo.world_size, priced)
        print(
            f"{name:<22} {2 * n / 1e6:5.2f} MB  measured {t * 1e3:7.1f} ms  cost model {model * 1e3:7.1f} ms"
        )


if __name__ == "__main__":
    main()
