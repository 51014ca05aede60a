"""One rank of the launcher tests: discover, join the process group, all-reduce, build the zerotopo mesh
(whose start-up check compares the placement with the topology), report as JSON.

Run under srun or mpiexec with ``ZEROTOPO_EMULATED_NODES=2``; prints one JSON object per rank.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from zerotopo.comm.mesh import build_mesh
from zerotopo.launch import discover, init_distributed, topological_index
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology


def main() -> None:
    info = discover()
    init_distributed(info, timeout_s=120)
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    topology = load_topology("emulated")
    index = topological_index(info, topology)
    mesh = build_mesh(topology, get_preset("zerotopo"), topo_index=index)
    placements: list = [None] * info.world_size
    dist.all_gather_object(placements, (info.rank, info.node_id, index))
    dist.destroy_process_group()
    print(
        json.dumps(
            {
                "rank": info.rank,
                "launcher": info.launcher,
                "sum": total.item(),
                "all": placements,
                "mesh_rank_of_index": list(mesh.rank_of_index),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
