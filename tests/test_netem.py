"""The emulated network: nodes in their own namespaces, the inter-node link really slower."""

from __future__ import annotations

import subprocess
import time

import pytest

from zerotopo.netem import available, emulated_network
from zerotopo.spawn import spawn

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=f"emulated network unavailable: {why}")


def _pair_bandwidth(rank: int, world: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    out = {}
    for name, members in (("intra", [0, 1]), ("inter", [0, 2])):
        group = dist.new_group(members)
        t = torch.zeros(1 << 20)
        if rank in members:
            dist.all_reduce(t, group=group)
            t0 = time.perf_counter()
            for _ in range(3):
                dist.all_reduce(t, group=group)
            out[name] = 3 * t.numel() * 4 / (time.perf_counter() - t0) / 1e6
        dist.barrier()
    return out


@pytest.mark.slow
def test_inter_node_link_is_shaped_and_namespaces_are_removed():
    with emulated_network(2, rate_mbit=200) as net:
        names = set(net.namespaces)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert names <= {line.split()[0] for line in listed.splitlines() if line.strip()}
        result = spawn(_pair_bandwidth, 4, ranks_per_node=2, network=net, timeout_s=300)[0]
    # 200 Mbit/s = 25 MB/s per direction; an all-reduce of 4 MiB between 2 ranks moves 4 MiB each way.
    assert result["inter"] < 40, result
    assert result["intra"] > 2 * result["inter"], result
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not names & {line.split()[0] for line in listed.splitlines() if line.strip()}
