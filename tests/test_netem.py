"""The emulated network: nodes in their own namespaces, the inter-node link really slower."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from zerotopo.launch.netem import available, emulated_network
from zerotopo.launch.spawn import spawn

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
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

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


# -- one namespace per rank, every tier shaped --------------------------------------------------------

_SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, n * 8 / (time.perf_counter() - t0) / 1e6, flush=True)
"""
_SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5001)); buf = b"x" * (1 << 16); t0 = time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[2]):
    c.sendall(buf)
c.close()
"""


def _stream(net, src: int, dst: int, seconds: float = 1.0) -> tuple[int, float]:
    """One TCP stream from rank ``src`` to rank ``dst`` for ``seconds``: the bytes the sink received
    and its throughput, Mbit/s."""
    import sys

    sink = subprocess.Popen(
        ["ip", "netns", "exec", net.namespaces[dst], sys.executable, "-c", _SINK, net.addresses[dst]],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout.readline().strip() == "ready"
    subprocess.run(
        ["ip", "netns", "exec", net.namespaces[src], sys.executable, "-c", _SOURCE, net.addresses[dst],
         str(seconds)],
        check=True,
    )  # fmt: skip
    received, mbit = sink.communicate(timeout=30)[0].split()
    return int(received), float(mbit)


@pytest.mark.slow
def test_every_tier_is_shaped_by_destination_and_counted_per_tier():
    from zerotopo.launch.netem import class_bytes, emulated_cluster, our_namespaces
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-frontier")  # 2 nodes x 2 packages x 2 dies
    with emulated_cluster(topo, network_mbit=10) as net:
        assert net.per_rank and len(net.namespaces) == topo.world_size == 8
        assert net.tier_rates_mbit == {"package": 160.0, "node": 40.0, "network": 10.0}
        assert set(our_namespaces(os.getpid())) >= set(net.namespaces)
        streams = {
            tier: _stream(net, 0, peer) for tier, peer in (("package", 1), ("node", 2), ("network", 4))
        }
        sent = class_bytes(namespace=net.namespaces[0])
    # each stream within 30% below its shaped rate, never above it, and the tiers 4x apart
    rates = {tier: mbit for tier, (_, mbit) in streams.items()}
    for tier, rate in rates.items():
        assert 0.7 * net.tier_rates_mbit[tier] < rate < 1.1 * net.tier_rates_mbit[tier], rates
    # what crossed each tier is in that tier's class and no other: the bytes its sink received plus the
    # TCP/IP headers (4.6% at a 1500-byte MTU). (Not rate x 1 s: the sender's socket buffer drains after it stops.)
    per_tier = {tier: sent[cls] for tier, cls in net.tier_classes.items()}
    for tier, (received, _) in streams.items():
        assert received <= per_tier[tier] < 1.1 * received, (per_tier, streams)
    assert not set(our_namespaces(os.getpid())) & set(net.namespaces)


def test_rank_namespaces_map_ranks_to_endpoints():
    from zerotopo.errors import ZerotopoError
    from zerotopo.launch.netem import EmulatedNetwork

    per_node = EmulatedNetwork(("a", "b"), ("x", "y"), 10.0, 0.0)
    assert per_node.rank_namespaces(4, 2) == ("a", "a", "b", "b")
    per_rank = EmulatedNetwork(("a", "b", "c", "d"), ("w", "x", "y", "z"), 10.0, 0.0, per_rank=True)
    assert per_rank.rank_namespaces(4, 2) == ("a", "b", "c", "d")
    with pytest.raises(ZerotopoError, match="4 rank namespaces, the job 8"):
        per_rank.rank_namespaces(8, 4)


def test_tier_rates_follow_frontier_ratios_and_overrides():
    from zerotopo.errors import ZerotopoError
    from zerotopo.launch.netem import parse_rates, tier_rates
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-frontier")
    assert tier_rates(topo, 50) == {"package": 800.0, "node": 200.0, "network": 50.0}
    assert tier_rates(topo, 50, parse_rates("node=400")) == {"package": 800.0, "node": 400.0, "network": 50.0}
    with pytest.raises(ZerotopoError, match="cannot shape tier 'rack'"):
        tier_rates(topo, 50, {"rack": 1.0})
    with pytest.raises(ZerotopoError, match="tier=Mbit/s"):
        parse_rates("package:800")


# -- teardown on signals ------------------------------------------------------------------------------

_LAUNCHER = """
import sys, time
from zerotopo.launch.netem import emulated_cluster
from zerotopo.launch.spawn import spawn
from zerotopo.placement.topology import load_topology
from tests.test_netem import _sleeper
with emulated_cluster(load_topology("emulated-frontier"), network_mbit=10) as net:
    print("up", flush=True)
    spawn(_sleeper, 8, ranks_per_node=4, network=net, timeout_s=300)
"""


def _sleeper(rank: int, world: int) -> None:
    time.sleep(300)


def _pids_in(namespaces: list[str]) -> set[int]:
    from zerotopo.launch.netem import _namespace_pids

    return {pid for ns in namespaces for pid in _namespace_pids(ns)}


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_tears_down_namespaces_and_ranks(sig):
    import signal
    import sys

    from zerotopo.launch.netem import our_namespaces

    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "up"
        ours = our_namespaces(proc.pid)
        assert len(ours) == 9  # 8 ranks and the switch
        deadline = time.monotonic() + 120
        while len(ranks := _pids_in(ours)) < 8 and time.monotonic() < deadline:
            time.sleep(0.5)  # ranks enter their namespaces once torch is imported
        assert len(ranks) >= 8, ranks
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert our_namespaces(proc.pid) == []
    alive = [pid for pid in ranks if os.path.exists(f"/proc/{pid}")]
    assert alive == [], f"rank processes left behind: {alive}"


def test_stale_namespaces_of_a_dead_launcher_are_removed():
    from zerotopo.launch.netem import PREFIX, our_namespaces, remove_stale

    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{PREFIX}{dead.pid}-test-sw"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in our_namespaces(dead.pid)
        assert name in remove_stale()
        assert our_namespaces(dead.pid) == []
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _fails(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 breaks")
    time.sleep(300)  # the others would wait forever in a collective


@pytest.mark.slow
def test_an_error_in_a_rank_tears_everything_down():
    from pathlib import Path

    from zerotopo.errors import ZerotopoError
    from zerotopo.launch.netem import emulated_cluster, our_namespaces
    from zerotopo.placement.topology import load_topology

    topo = load_topology(Path(__file__).parent / "lab" / "bench" / "mini-frontier.yaml")  # 4 ranks
    with pytest.raises(ZerotopoError, match="rank 1 breaks"), emulated_cluster(topo, network_mbit=10) as net:
        spawn(_fails, 4, ranks_per_node=2, network=net, timeout_s=120)
    assert not set(our_namespaces(os.getpid())) & set(net.namespaces)
