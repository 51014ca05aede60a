"""``zerotopo env``: what rank discovery found for this process, and warnings about bad settings.

Run it under the same launcher as training (``srun ... zerotopo env --check --topology frontier``):
each rank prints one line (or one JSON object with ``--json``). ``--check`` exits with status 1 when
any warning or error applies, so a job script can stop before it spends its allocation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from zerotopo.errors import ZerotopoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when a warning or error applies"
    )
    parser.add_argument(
        "--topology", metavar="NAME", help="topology name or YAML path, for the topological index"
    )
    parser.add_argument("--nodes", type=int, metavar="N", help="nodes of the topology (default: the job's)")
    parser.add_argument(
        "--launcher",
        default="auto",
        choices=("auto", "slurm", "mpi", "torchrun", "local"),
        help="read the rank from this launcher's environment (default: detect)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per rank instead of text")


def _report(args: argparse.Namespace) -> tuple[dict, list[str], list[str]]:
    """(fields, warnings, errors) for this rank; errors are launch or topology problems."""
    from zerotopo.launch.advice import warnings_for
    from zerotopo.launch.discovery import check_against_topology, discover, topological_index

    info = discover(os.environ, prefer=args.launcher)
    fields = {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "local_world_size": info.local_world_size,
        "node": info.node_id,
        "num_nodes": info.num_nodes,
        "hostname": info.hostname,
        "physical_device": info.physical_device,
        "topological_index": None,
        "backend": info.backend,
        "device_kind": info.device_kind,
        "launcher": info.launcher,
        # port 0: a world of one binds any free port
        "master": f"{info.master_addr}:{info.master_port or 'any free port'}",
        "tasks_per_node": list(info.tasks_per_node),
    }
    errors: list[str] = []
    if args.topology:
        from zerotopo.placement.topology import load_topology

        topology = load_topology(args.topology, nodes=args.nodes or info.num_nodes)
        fields["topology"] = topology.name
        try:
            check_against_topology(info, topology)
            fields["topological_index"] = topological_index(info, topology)
        except ZerotopoError as exc:
            errors.append(str(exc))
    return fields, warnings_for(info, os.environ), errors


def run(args: argparse.Namespace) -> int:
    try:
        fields, warnings, errors = _report(args)
    except ZerotopoError as exc:
        if not args.check:
            raise
        fields, warnings, errors = {}, [], [str(exc)]
    if args.json:
        print(json.dumps({**fields, "warnings": warnings, "errors": errors}, sort_keys=True), flush=True)
    else:
        if fields:
            index = fields["topological_index"]
            print(
                f"rank {fields['rank']}/{fields['world_size']}  local {fields['local_rank']}/"
                f"{fields['local_world_size']}  node {fields['node']}/{fields['num_nodes']}  "
                f"host {fields['hostname']}  device {fields['device_kind']}:{fields['physical_device']}  "
                f"topo-index {'-' if index is None else index}  backend {fields['backend']}  "
                f"launcher {fields['launcher']}  master {fields['master']}",
                flush=True,
            )
        prefix = f"rank {fields['rank']}: " if fields else ""
        for line in errors:
            print(f"{prefix}error: {line}", file=sys.stderr)
        for line in warnings:
            print(f"{prefix}warning: {line}", file=sys.stderr)
    return 1 if args.check and (warnings or errors) else 0
