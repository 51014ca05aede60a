"""The alpha-beta step-time model and its overlap rules, on numbers small enough to check by hand."""

from __future__ import annotations

import pytest

from zerotopo.cost.comm import CollectiveCost, comm_per_step, edge_costs
from zerotopo.cost.time import collective_time, step_time
from zerotopo.models.shape import ModelShape
from zerotopo.plan import get_preset
from zerotopo.topology import topology_from_mapping

TOPO = topology_from_mapping(
    {
        "name": "toy",
        "device": {"name": "toy", "memory_gib": 1, "peak_tflops": 1e-6},
        "tiers": [{"name": "node", "fanout": 4, "bandwidth_gbps": 1.0, "latency_us": 10}],
        "network": {"name": "network", "injection_gbps": 2.0, "latency_us": 100},
        "nodes": 2,
    }
)
SHAPE = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)


def _c(phase, op="all_gather", size=4, tier="node", nbytes=10**9, count=1):
    return CollectiveCost(phase, op, "params", size, tier, nbytes, count, "bf16")


def test_collective_time_is_alpha_beta_on_the_tier_crossed():
    # ring all-gather over 4 ranks in a node: 3 steps x 10 us + 1 GB / 1 GB/s
    assert collective_time(_c("forward"), TOPO) == pytest.approx(3 * 10e-6 + 1.0)
    # all-reduce: 2(d-1) steps; across nodes the node's 2 GB/s injection is shared by its 4 devices
    ar = _c("replica_reduce", op="all_reduce", size=2, tier="network", nbytes=10**8)
    assert ar.latency_steps == 2
    assert collective_time(ar, TOPO) == pytest.approx(2 * 1 * 100e-6 + 1e8 / 0.5e9)


def test_compute_overlap_and_exposed_communication():
    m, M = 2, 3
    flops = SHAPE.step_flops(m * M, checkpoint_activations=False)
    compute = flops / (1e6 * 0.5)  # a 1 MFLOPS device: seconds of compute
    # no communication: the step is the compute at peak x efficiency
    t = step_time([], TOPO, SHAPE, micro_batch=m, micro_batches=M, checkpoint_activations=False)
    assert t.step_time_s == pytest.approx(compute) and t.exposed_comm_s == pytest.approx(0)
    assert t.mfu == pytest.approx(0.5) and t.tflops_per_device == pytest.approx(0.5e-6)
    assert t.tokens_per_s == pytest.approx(m * M * 16 * 8 / compute)
    # forward gathers that take less than the forward compute hide behind it (prefetch >= 1) ...
    per_mb_fwd = compute / 3 / M
    small = _c("forward", nbytes=int(per_mb_fwd * 0.5e9), count=M)
    g = collective_time(small, TOPO)
    t = step_time([small], TOPO, SHAPE, micro_batch=m, micro_batches=M, checkpoint_activations=False)
    assert t.step_time_s == pytest.approx(compute)
    # ... except the first unit's gather, which opens each forward
    head = _c("forward", nbytes=10**6)
    t = step_time(
        [small], TOPO, SHAPE, micro_batch=m, micro_batches=M, checkpoint_activations=False, edge=[head]
    )
    h = collective_time(head, TOPO)
    assert g - h < per_mb_fwd and t.step_time_s == pytest.approx(compute + M * h)
    # without prefetch everything adds up
    t = step_time(
        [small], TOPO, SHAPE, micro_batch=m, micro_batches=M, prefetch=0, checkpoint_activations=False
    )
    assert t.step_time_s == pytest.approx(compute + M * g)
    # communication longer than the compute shows: backward phase bounded by its collectives
    big = _c("grad_reduce", op="reduce_scatter", nbytes=10**11, count=M)
    t = step_time([big], TOPO, SHAPE, micro_batch=m, micro_batches=M, checkpoint_activations=False)
    assert t.step_time_s == pytest.approx(compute / 3 + M * collective_time(big, TOPO))
    # step-end collectives never overlap
    end = _c("param_gather", nbytes=10**8)
    t = step_time([end], TOPO, SHAPE, micro_batch=m, micro_batches=M, checkpoint_activations=False)
    assert t.step_time_s == pytest.approx(compute + collective_time(end, TOPO))


def test_recompute_costs_a_fourth_pass_and_counts_in_tflops_not_mfu():
    a = step_time([], TOPO, SHAPE, micro_batch=2, micro_batches=1, checkpoint_activations=False)
    b = step_time([], TOPO, SHAPE, micro_batch=2, micro_batches=1, checkpoint_activations=True)
    assert b.step_time_s == pytest.approx(a.step_time_s * 4 / 3)
    assert b.tflops_per_device == pytest.approx(a.tflops_per_device)  # hardware FLOPs, as NeoX logs
    assert b.mfu == pytest.approx(a.mfu * 3 / 4)
    with pytest.raises(ValueError, match="efficiency"):
        step_time([], TOPO, SHAPE, micro_batch=1, micro_batches=1, efficiency=0)


def test_edge_costs_are_the_first_units_gather_and_reduce_scatter():
    units = SHAPE.unit_params()
    plan = get_preset("zero3")
    edge = edge_costs(units, TOPO, plan, param_bytes=2, reduce_bytes=4)
    assert sorted(c.phase for c in edge) == ["forward", "grad_reduce"]
    full = comm_per_step(units, TOPO, plan, micro_batches=1)
    fwd_bytes = {c.bytes_sent for c in full if c.phase == "forward"}
    assert all(c.count == 1 and (c.phase != "forward" or c.bytes_sent in fwd_bytes) for c in edge)
