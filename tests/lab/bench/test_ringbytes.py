"""The schedule's bytes per tier hop by hop (what the emulated links count), one process."""

from __future__ import annotations

import pytest

from zerotopo.cost.planner import CostOptions, estimate
from zerotopo.placement.plan import get_preset
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology
from zerotopo_lab.bench.ringbytes import (
    group_tier_bytes,
    group_tier_messages,
    ring_tier_bytes,
    ring_tier_messages,
)


@pytest.fixture(scope="module")
def topo():
    return load_topology("emulated-frontier")  # 2 nodes x 2 packages x 2 dies


def test_a_ring_puts_each_hop_in_the_tier_it_crosses(topo):
    # 0..7: 4 hops inside a package, 2 across packages (1-2, 5-6), 2 across nodes (3-4, 7-0)
    assert group_tier_bytes("all_gather", list(range(8)), 10.0, topo) == {
        "package": 40,
        "node": 20,
        "network": 20,
    }
    # [0, 2, 4, 6]: half its hops stay in a node
    assert group_tier_bytes("all_reduce", [0, 2, 4, 6], 10.0, topo) == {"node": 20, "network": 20}
    # an all-to-all sends a share to every other member: from each of 4 members, 2 of 3 shares leave the node
    got = group_tier_bytes("reduce_scatter_int4", [0, 2, 4, 6], 30.0, topo)
    assert got == pytest.approx({"node": 40, "network": 80})
    assert group_tier_bytes("all_gather", [3], 10.0, topo) == {}


def test_messages_are_counted_per_hop_in_the_tier_they_cross(topo):
    # [0, 2, 4, 6]: a ring's member sends d - 1 = 3 messages to its next; half the hops leave the node
    assert group_tier_messages("all_gather", [0, 2, 4, 6], topo) == {"node": 6, "network": 6}
    # gloo's all-reduce runs two ring passes (reduce-scatter, all-gather)
    assert group_tier_messages("all_reduce", [0, 2, 4, 6], topo) == {"node": 12, "network": 12}
    # an all-to-all sends one message to every other member: 2 of each member's 3 leave the node
    assert group_tier_messages("reduce_scatter_int4", [0, 2, 4, 6], topo) == {"node": 4, "network": 8}
    assert group_tier_messages("all_gather", [5], topo) == {}


def test_a_rows_excess_payload_is_divided_by_its_cross_node_messages():
    from zerotopo_lab.bench.compare import row_ratios

    row = {
        "ring_tier_bytes": {"node": 500.0, "network": 1000.0},
        "ring_tier_messages": {"node": 2.0, "network": 4.0},
        "tier_bytes_per_step": {"node": 600.0, "network": 1300.0},
        "tier_payload_bytes_per_step": {"node": 520.0, "network": 1200.0},
    }
    row_ratios(row, "network")
    assert row["network_payload_over_ring"] == pytest.approx(1.2)
    assert row["network_excess_bytes_per_message"] == pytest.approx(50.0)
    del row["ring_tier_messages"]  # a report from before the messages were counted: no figure
    row.pop("network_excess_bytes_per_message")
    row_ratios(row, "network")
    assert "network_excess_bytes_per_message" not in row


@pytest.mark.parametrize("preset", ["zero3", "zerotopo", "zeropp", "mics"])
def test_every_byte_of_the_schedule_is_on_one_tier(topo, preset):
    shape = ModelShape(
        name="t", hidden_size=64, num_layers=2, num_attention_heads=4, vocab_size=256, seq_length=32
    )
    plan = get_preset(preset)
    est = estimate(plan, shape, topo, CostOptions(micro_batch=1, grad_accum=2))
    ring = ring_tier_bytes(est.schedule, topo, plan.degrees(topo))
    assert set(ring) == set(topo.tier_names)
    total = sum(c.bytes_sent * c.count for c in est.schedule.collectives())
    assert sum(ring.values()) == pytest.approx(total)
    if preset == "zero3":  # one ring over the world: package : node : network = 2 : 1 : 1
        assert ring["package"] == pytest.approx(2 * ring["node"]) and ring["node"] == pytest.approx(
            ring["network"]
        )
    if preset == "mics":  # nothing leaves a node but the cross-replica all-reduce
        assert ring["network"] > 0
    messages = ring_tier_messages(est.schedule, topo, plan.degrees(topo))
    assert set(messages) == set(topo.tier_names)
    # every call: d - 1 messages per member (an all-reduce twice that), summed over its groups' members
    want = sum(
        (2 if c.op == "all_reduce" else 1) * (c.group_size - 1) * topo.world_size * c.count
        for c in est.schedule.collectives()
        if c.group_size > 1
    )
    assert sum(messages.values()) * topo.world_size == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 4])
def test_the_zerotopo_rows_links_carry_its_schedule_across_nodes(nodes):
    # the links' counters over whole steps (the engine's lazy parameter gathers landed) against the
    # schedule hop by hop: the payload (headers off) within 5%, the wire's bytes above it
    from zerotopo.launch.netem import available
    from zerotopo_lab.bench.compare import CompareOptions, compare, format_report

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated network unavailable: {why}")
    opts = CompareOptions(model="small", rows=("zerotopo",), nodes=nodes, steps=1, warmup=1, micro_batches=1,
                          batch=1, dtype="bf16", network_mbit=400, timeout_s=900)  # fmt: skip
    report = compare(opts, command="test")
    (row,) = report["rows"]
    payload = row["network_payload_over_ring"]
    assert payload == pytest.approx(1.0, abs=0.05), row["tier_payload_bytes_per_step"]
    assert row["network_bytes_over_ring"] > payload
    # what the payload holds beyond the schedule's bytes is the transport's per message: a few hundred
    # bytes (175-380 on every row of the scale runs), not a share of the bytes
    assert row["ring_tier_messages"]["network"] > 0
    assert 0 < row["network_excess_bytes_per_message"] < 2000, row["network_excess_bytes_per_message"]
    assert "per message the schedule sends across nodes: zerotopo" in format_report(report)


@pytest.mark.slow
def test_deepspeed_hpz_links_carry_its_schedule_over_several_micro_batches():
    # DeepSpeed gathers the later micro-batches' forwards from its hpZ copy inside the node: every tier's
    # payload within 5% of the schedule's (a schedule gathering every forward over the job is 16% off)
    pytest.importorskip("deepspeed")
    from zerotopo.launch.netem import available
    from zerotopo_lab.bench.compare import CompareOptions, compare

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated network unavailable: {why}")
    opts = CompareOptions(model="small", rows=("deepspeed-hpz",), nodes=2, steps=1, warmup=1, micro_batches=3,
                          batch=1, dtype="bf16", network_mbit=400, timeout_s=900)  # fmt: skip
    (row,) = compare(opts, command="test")["rows"]
    ring, payload = row["ring_tier_bytes"], row["tier_payload_bytes_per_step"]
    for tier in ring:
        assert payload[tier] == pytest.approx(ring[tier], rel=0.05), (tier, payload, ring)
    # the copy's gathers cross packages inside a node; rings over the job alone put as much on each tier
    assert ring["node"] > ring["network"]
