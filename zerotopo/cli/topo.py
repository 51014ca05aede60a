"""``zerotopo topo``: list, show and validate topology descriptors (docs/topology.md).

``show`` draws the node's tier tree with fan-outs, per-device bandwidth and latency, which topological
indices share each package and node, and which launcher local rank lands on which device.
"""

from __future__ import annotations

import argparse
import sys

from zerotopo.placement.topology import Topology, builtin_topologies, load_topology

#: Nodes drawn in full by ``show``; the rest are summarised (their layout repeats).
SHOWN_NODES = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="topo_command", metavar="ACTION")
    p = sub.add_parser("show", help="draw a topology's tiers and which ranks share what")
    p.add_argument("topology", help="built-in name (frontier, dgx-a100, ...) or path of a YAML file")
    p.add_argument("--nodes", type=int, default=None, help="node count (default: the file's, else 1)")
    sub.add_parser("list", help="list the built-in topologies")
    p = sub.add_parser("validate", help="check a topology file; prints OK and a summary, or the error")
    p.add_argument("path", help="YAML file to check")
    p.add_argument("--nodes", type=int, default=None, help="node count to check it with")


def _gbps(x: float) -> str:
    return f"{x:g} GB/s"


def summary(topo: Topology) -> str:
    """One line: name, nodes, devices, device type."""
    fan = " x ".join(f"{t.name} {t.fanout}" for t in topo.tiers)
    return (
        f"{topo.name}: {topo.nodes} node(s) x {topo.devices_per_node} devices (fan-outs {fan}) = {topo.world_size} "
        f"ranks of {topo.device.name} ({topo.device.memory_gib:g} GiB, {topo.device.peak_tflops:g} TFLOPS)"
    )


def tier_table(topo: Topology) -> list[str]:
    """The tiers, innermost first: fan-out, devices per instance, bandwidth per device, latency."""
    rows = [("tier", "fan-out", "devices", "GB/s per device", "latency")]
    for t in topo.tiers:
        rows.append(
            (
                t.name,
                str(t.fanout),
                str(topo.tier_size(t.name)),
                f"{t.bandwidth_gbps:g}",
                f"{t.latency_us:g} us",
            )
        )
    net = topo.network
    rows.append(
        (
            net.name,
            f"{topo.nodes} nodes",
            str(topo.world_size),
            f"{topo.bandwidth_gbps(net.name):g} ({net.injection_gbps:g}/node)",
            f"{net.latency_us:g} us",
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _local_ranks(topo: Topology) -> dict[int, int]:
    """Physical device position -> launcher local rank."""
    order = topo.device_order or tuple(range(topo.devices_per_node))
    return {dev: lr for lr, dev in enumerate(order)}


def tree(topo: Topology, shown_nodes: int = SHOWN_NODES) -> list[str]:
    """The tier tree: each instance with its topological indices (and the local ranks placed there)."""
    local = _local_ranks(topo)
    dpn = topo.devices_per_node
    lines = [
        f"{topo.network.name} ({topo.nodes} nodes, {_gbps(topo.bandwidth_gbps(topo.network.name))}/device)"
    ]

    def walk(level: int, start: int, prefix: str, last: bool, node: int) -> None:
        t = topo.tiers[level]
        size = topo.tier_size(t.name)
        idx = (start % dpn) // size
        span = range(start, start + size)
        devs = " ".join(str(i) for i in span)
        locs = " ".join(str(local[i % dpn]) for i in span)
        label = f"node {node}" if level == len(topo.tiers) - 1 else f"{t.name} {idx}"
        branch = "└─ " if last else "├─ "
        lines.append(
            f"{prefix}{branch}{label} ({_gbps(t.bandwidth_gbps)}, {t.latency_us:g} us): ranks {devs}"
            + (f"  <- local ranks {locs}" if topo.device_order else "")
        )
        if level == 0:
            return
        child = topo.tier_size(topo.tiers[level - 1].name)
        kids = list(range(start, start + size, child))
        for k, s in enumerate(kids):
            walk(level - 1, s, prefix + ("   " if last else "│  "), k == len(kids) - 1, node)

    shown = min(topo.nodes, shown_nodes)
    for n in range(shown):
        walk(len(topo.tiers) - 1, n * dpn, "", n == shown - 1 and shown == topo.nodes, n)
    if topo.nodes > shown:
        lines.append(
            f"└─ ... nodes {shown}..{topo.nodes - 1} repeat the layout (rank = node x {dpn} + position)"
        )
    return lines


def show(topo: Topology) -> str:
    out = [summary(topo)]
    if topo.description:
        out.append(topo.description)
    out += ["", *tier_table(topo), "", *tree(topo)]
    if topo.device_order:
        order = ", ".join(f"{lr}->{dev}" for lr, dev in enumerate(topo.device_order))
        out += ["", f"device order (local rank -> device position in the node): {order}"]
    out.append(
        "ranks above are topological indices: position in the node (innermost tier fastest) + node x "
        f"{topo.devices_per_node}"
    )
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "topo_command", None)
    if action == "list":
        for name in builtin_topologies():
            print(summary(load_topology(name)))
        return 0
    if action == "show":
        print(show(load_topology(args.topology, nodes=args.nodes)))
        return 0
    if action == "validate":
        topo = load_topology(args.path, nodes=args.nodes)
        print(f"OK {args.path}")
        print(summary(topo))
        return 0
    print("usage: zerotopo topo {show,list,validate} ... (see zerotopo topo --help)", file=sys.stderr)
    return 2
