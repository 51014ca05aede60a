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


def _link_bytes(rank: int, world: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from zerotopo.comm.collectives import reduce_scatter
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.plan import get_preset
    from zerotopo.topology import load_topology

    def tx() -> int:
        with open("/proc/self/net/dev") as f:  # per network namespace
            for line in f:
                name, _, fields = line.partition(":")
                if name.strip() == "eth0":
                    return int(fields.split()[8])
        raise AssertionError("no eth0 in this namespace")

    mesh = build_mesh(load_topology("emulated"), get_preset("zero3"), topo_index=rank)
    n = 1 << 18
    full = (torch.arange(n) % 1000).float() * (rank + 1)
    out = torch.empty(n // world)
    sent = {}
    for name, op in (
        ("all_reduce", lambda: dist.all_reduce(full.clone())),
        ("reduce_scatter", lambda: reduce_scatter(out, full, mesh.group("world"))),
    ):
        dist.barrier()
        t0 = tx()
        op()
        dist.barrier()
        sent[name] = tx() - t0
    assert torch.equal(out, (torch.arange(n) % 1000).float().view(world, -1)[rank] * 36)
    return sent


@pytest.mark.slow
def test_reduce_scatter_sends_half_of_an_all_reduce_across_nodes():
    # gloo's own reduce_scatter is an all-reduce in disguise; zerotopo's ring sends (d-1)/d of the message
    with emulated_network(2, rate_mbit=800) as net:
        sent = spawn(_link_bytes, 8, ranks_per_node=4, network=net, timeout_s=300)[0]
    message = (1 << 18) * 4
    assert sent["reduce_scatter"] < 0.6 * sent["all_reduce"], sent
    assert 7 / 8 * message <= sent["reduce_scatter"] < 1.1 * message, sent
