"""One call's bytes per tier: each collective the ``zerotopo`` plan's step runs, on its own mesh group of
the emulated Frontier, sends across each shaped tier what a ring over the group's positions sends
(every hop's bytes in the tier its two ranks cross), read from the links' htb counters."""

from __future__ import annotations

import pytest

from zerotopo.launch.netem import available

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=f"emulated network unavailable: {why}")

NUMEL = 1 << 20
"""Elements of each call's whole message (4 MiB in fp32): large enough that headers are a few percent."""
CALLS = (
    ("all_gather", "params"),
    ("all_gather", "secondary"),
    ("all_gather", "param_gather"),
    ("reduce_scatter", "grads"),
    ("reduce_scatter", "optim_scatter"),
    ("all_reduce", "optim"),
)


def _calls(rank: int, world: int, tier_classes: dict[str, str]) -> dict[str, dict[str, int]]:
    import torch
    import torch.distributed as dist

    from zerotopo.comm import collectives as C
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.measure import link_tier_bytes

    mesh = build_mesh(load_topology("emulated-frontier"), get_preset("zerotopo"), topo_index=rank)
    out = {}
    for op, kind in CALLS:
        group = mesh.group(kind)
        d = group.size
        whole = torch.ones(NUMEL)
        dist.barrier()
        before = link_tier_bytes(tier_classes)
        if op == "all_gather":
            C.all_gather(whole, torch.ones(NUMEL // d), group)
        elif op == "reduce_scatter":
            C.reduce_scatter(torch.empty(NUMEL // d), whole, group)
        else:
            C.all_reduce(whole, group)
        dist.barrier()
        after = link_tier_bytes(tier_classes)
        out[f"{op} {kind}"] = {t: after[t] - before[t] for t in after}
    return out


def ring_tier_bytes(op: str, members: list[int], topo, numel: int, width: int) -> dict[str, float]:
    """Bytes each tier carries in one call over ``members`` (ring order), mean per rank of the world."""
    from zerotopo.placement import volume

    d = len(members)
    per_rank = {"all_gather": volume.all_gather_bytes, "reduce_scatter": volume.reduce_scatter_bytes,
                "all_reduce": volume.all_reduce_bytes}[op](numel, d, width)  # fmt: skip
    out: dict[str, float] = {}
    for i, r in enumerate(members):
        tier = topo.tier_of_group((r, members[(i + 1) % d])) or topo.network.name
        out[tier] = out.get(tier, 0.0) + per_rank
    return out


@pytest.mark.slow
def test_each_call_sends_what_its_ring_sends_across_each_tier():
    from zerotopo.launch.netem import emulated_cluster
    from zerotopo.launch.spawn import spawn
    from zerotopo.placement.layout import groups
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-frontier")
    degrees = get_preset("zerotopo").degrees(topo)
    with emulated_cluster(topo, network_mbit=400) as net:
        results = spawn(_calls, topo.world_size, args=(dict(net.tier_classes),), ranks_per_node=4, network=net,
                        timeout_s=600)  # fmt: skip
    bad = []
    for op, kind in CALLS:
        key = f"{op} {kind}"
        measured: dict[str, float] = {}
        for r in results:
            for tier, b in r[key].items():
                measured[tier] = measured.get(tier, 0) + b
        expected: dict[str, float] = {}
        for members in groups(degrees, kind):
            for tier, b in ring_tier_bytes(op, members, topo, NUMEL, 4).items():
                expected[tier] = expected.get(tier, 0) + b
        for tier in measured:
            want = expected.get(tier, 0.0)
            # TCP/IP headers and ACKs: a few percent above the payload, never below it
            if not want * 0.99 <= measured[tier] <= want * 1.06 + 20_000:
                bad.append(f"{key} {tier}: measured {measured[tier] / 1e6:.3f} MB, ring {want / 1e6:.3f} MB")
    assert not bad, "; ".join(bad)
