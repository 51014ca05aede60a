"""One rank of the launcher tests: discover, join the process group, all-reduce, report as JSON.

Run under srun or mpiexec with ``ZEROTOPO_EMULATED_NODES=2``; prints one JSON object per rank.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from zerotopo.launch import discover, init_distributed, topological_index
from zerotopo.topology import load_topology


def main() -> None:
    info = discover()
    init_distributed(info, timeout_s=120)
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    index = topological_index(info, load_topology("emulated"))
    hosts: list = [None] * info.world_size
    dist.all_gather_object(hosts, (info.rank, info.node_id, index))
    dist.destroy_process_group()
    print(
        json.dumps({"rank": info.rank, "launcher": info.launcher, "sum": total.item(), "all": hosts}),
        flush=True,
    )


if __name__ == "__main__":
    main()
