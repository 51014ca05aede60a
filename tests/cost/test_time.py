"""The step-time model: collective times, the two-stream overlap simulation and its parameters, on
schedules small enough to check by hand."""

from __future__ import annotations

import pytest

from zerotopo.cost.comm import CollectiveCost, comm_per_step, edge_costs, schedule_of
from zerotopo.cost.time import OverlapModel, collective_time, step_time
from zerotopo.placement.plan import get_preset
from zerotopo.placement.schedule import Collective, StepSchedule, Unit, UnitSteps, engine_units
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import topology_from_mapping

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
#: no latency, 1 GB/s: a collective of b bytes takes b / 1e9 seconds
FLAT = topology_from_mapping(
    {
        "name": "flat",
        "device": {"name": "toy", "memory_gib": 1, "peak_tflops": 1e-6},
        "tiers": [{"name": "node", "fanout": 4, "bandwidth_gbps": 1.0, "latency_us": 0}],
        "network": {"name": "network", "injection_gbps": 4.0, "latency_us": 0},
        "nodes": 2,
    }
)
NO_SLOWDOWN = OverlapModel(compute_slowdown=0.0)


def _c(phase, op="all_gather", size=4, tier="node", nbytes=10**9, count=1):
    return CollectiveCost(phase, op, "params", size, tier, nbytes, count, "bf16")


def test_collective_time_is_alpha_beta_on_the_tier_crossed():
    # ring all-gather over 4 ranks in a node: 3 steps x 10 us + 1 GB / 1 GB/s
    assert collective_time(_c("forward"), TOPO) == pytest.approx(3 * 10e-6 + 1.0)
    # all-reduce: 2(d-1) steps; across nodes the node's 2 GB/s injection is shared by its 4 devices
    ar = _c("replica_reduce", op="all_reduce", size=2, tier="network", nbytes=10**8)
    assert ar.latency_steps == 2
    assert collective_time(ar, TOPO) == pytest.approx(2 * 1 * 100e-6 + 1e8 / 0.5e9)


def _sched(units, fwd_bytes, bwd_bytes, red_bytes, *, prefetch=1, end=(), M=1, red_tier="node"):
    """Units of equal FLOPs; per unit one forward gather, one backward gather, one reduction (bytes or 0)."""
    steps = []
    for i in range(units):
        f = (
            (Collective("forward", "all_gather", "params", 4, "node", fwd_bytes[i], 1, "bf16"),)
            if fwd_bytes[i]
            else ()
        )
        b = (
            (Collective("backward", "all_gather", "params", 4, "node", bwd_bytes[i], 1, "bf16"),)
            if bwd_bytes[i]
            else ()
        )
        r = (
            (Collective("grad_reduce", "reduce_scatter", "grads", 4, red_tier, red_bytes[i], 1, "fp32"),)
            if red_bytes[i]
            else ()
        )
        steps.append(UnitSteps(Unit(f"u{i}", 1, flops=1.0), f, b, r, prefetch, prefetch))
    return StepSchedule(tuple(steps), tuple(end), M)


def _compute(m, M, ckpt=False):
    return SHAPE.step_flops(m * M, checkpoint_activations=ckpt) / (1e6 * 0.5)  # a 1 MFLOPS device


def test_no_communication_is_the_compute():
    m, M = 2, 3
    compute = _compute(m, M)
    t = step_time(
        _sched(2, [0, 0], [0, 0], [0, 0], M=M), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False
    )
    assert t.step_time_s == pytest.approx(compute) and t.exposed_comm_s == pytest.approx(0)
    assert t.mfu == pytest.approx(0.5) and t.tflops_per_device == pytest.approx(0.5e-6)
    assert t.tokens_per_s == pytest.approx(m * M * 16 * 8 / compute)


def test_prefetch_hides_gathers_but_the_first_and_none_without_prefetch():
    m = 2
    k = _compute(m, 1) / 3 / 2  # forward compute of one of two equal units
    g = int(k * 0.5 * 1e9)  # a gather taking half of it
    s = _sched(2, [g, g], [0, 0], [0, 0])
    t = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    # the first gather opens the step, the second hides under the first unit's compute
    assert t.step_time_s == pytest.approx(_compute(m, 1) + g / 1e9)
    fwd = {(x.phase, x.op): x for x in t.breakdown}[("forward", "all_gather")]
    assert fwd.calls == 2 and fwd.seconds == pytest.approx(2 * g / 1e9)
    assert fwd.exposed_s == pytest.approx(g / 1e9) and fwd.hidden_s == pytest.approx(g / 1e9)
    # without prefetch each gather waits for the previous compute: both exposed
    s0 = _sched(2, [g, g], [0, 0], [0, 0], prefetch=0)
    t0 = step_time(s0, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    assert t0.step_time_s == pytest.approx(_compute(m, 1) + 2 * g / 1e9)
    # the compute slowdown applies to compute that runs while a gather is in flight
    slow = OverlapModel(compute_slowdown=0.5)
    ts = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=slow)
    assert ts.slowdown_s == pytest.approx(0.5 * g / 1e9)
    assert ts.step_time_s == pytest.approx(_compute(m, 1) + g / 1e9 + 0.5 * g / 1e9)


def test_long_gathers_bound_the_phase_and_reductions_close_the_backward():
    m = 2
    kb = _compute(m, 1) * 2 / 3 / 2  # backward compute of one unit
    big = int(kb * 3 * 1e9)  # a backward gather three times the unit's backward compute
    s = _sched(2, [0, 0], [big, 0], [0, 0])  # unit 0 (computed last in the backward) gathers
    t = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    # backward: unit 1 computes while unit 0's gather runs (prefetched), then unit 0 computes
    assert t.step_time_s == pytest.approx(_compute(m, 1) / 3 + big / 1e9 + kb)
    # a reduction after the last backward unit is exposed; one after the first hides under unit 0
    r = int(kb * 0.5 * 1e9)
    tail = step_time(_sched(2, [0, 0], [0, 0], [r, 0]), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                     overlap=NO_SLOWDOWN)  # fmt: skip
    hid = step_time(_sched(2, [0, 0], [0, 0], [0, r]), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                    overlap=NO_SLOWDOWN)  # fmt: skip
    assert tail.step_time_s == pytest.approx(_compute(m, 1) + r / 1e9)
    assert hid.step_time_s == pytest.approx(_compute(m, 1))


def test_host_reductions_hold_the_backward_that_a_side_stream_hides():
    # on CPU ranks the engine reduces each unit's gradients on the computing thread: the backward of the
    # next unit starts when the reduction returns, so every reduction is exposed
    m, M = 2, 3
    kb = _compute(m, 1) * 2 / 3 / 3  # three units
    r = int(kb * 0.5 * 1e9)
    s = _sched(3, [0, 0, 0], [0, 0, 0], [r, r, r], M=M)
    side = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    host = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                     overlap=OverlapModel(compute_slowdown=0.0, host_reduce=True))  # fmt: skip
    # a side stream hides u2's and u1's reductions under the next unit's backward; u0's closes the step
    assert side.step_time_s == pytest.approx(_compute(m, M) + M * r / 1e9)
    assert host.step_time_s == pytest.approx(_compute(m, M) + 3 * M * r / 1e9)
    assert OverlapModel(host_reduce=True).to_dict()["host_reduce"] is True


def test_one_communication_stream_serialises_gathers_and_reductions():
    m = 2
    kb = _compute(m, 1) * 2 / 3 / 3  # three units
    x = int(kb * 0.8 * 1e9)
    # backward order u2, u1, u0: u2's reduction and u0's gather (prefetched while u1 computes) run side by
    # side on two streams, one after the other on one
    s = _sched(3, [0, 0, 0], [x, 0, 0], [0, x, x], red_tier="network")
    two = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    one = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                    overlap=OverlapModel(compute_slowdown=0.0, concurrent=1))  # fmt: skip
    # two streams: everything hides; one stream: u0's gather queues behind u2's reduction and starts
    # 0.8 kb into u1's compute, so u0 waits 0.6 kb
    assert two.step_time_s == pytest.approx(_compute(m, 1))
    assert one.step_time_s == pytest.approx(_compute(m, 1) + 0.6 * kb)
    # on the same tier the two streams share its links: u0's gather, started while u2's reduction has
    # 0.8 kb to go, takes 0.8 kb longer and u0 waits 0.6 kb
    same = step_time(_sched(3, [0, 0, 0], [x, 0, 0], [0, x, x]), FLAT, SHAPE, micro_batch=m,
                     checkpoint_activations=False, overlap=NO_SLOWDOWN)  # fmt: skip
    assert same.step_time_s == pytest.approx(_compute(m, 1) + 0.6 * kb)


def test_step_end_collectives_never_overlap_unless_told():
    m, M = 2, 3
    end = Collective(
        "param_gather", "all_gather", "param_gather", 4, "node", 10**8, 1, "bf16", overlappable=False
    )
    s = _sched(2, [0, 0], [0, 0], [0, 0], end=[end], M=M)
    t = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False)
    assert t.step_time_s == pytest.approx(_compute(m, M) + 0.1)
    assert t.exposed_comm_s == pytest.approx(0.1)
    half = step_time(s, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                     overlap=OverlapModel(step_end_overlap=0.5))  # fmt: skip
    assert half.step_time_s == pytest.approx(_compute(m, M) + 0.05)


def test_recompute_costs_a_fourth_pass_and_counts_in_tflops_not_mfu():
    s = _sched(2, [0, 0], [0, 0], [0, 0])
    a = step_time(s, TOPO, SHAPE, micro_batch=2, checkpoint_activations=False)
    b = step_time(s, TOPO, SHAPE, micro_batch=2, checkpoint_activations=True)
    assert b.step_time_s == pytest.approx(a.step_time_s * 4 / 3)
    assert b.tflops_per_device == pytest.approx(a.tflops_per_device)  # hardware FLOPs, as NeoX logs
    assert b.mfu == pytest.approx(a.mfu * 3 / 4)
    with pytest.raises(ValueError, match="efficiency"):
        step_time(s, TOPO, SHAPE, micro_batch=1, efficiency=0)
    for bad in (dict(compute_slowdown=-1), dict(concurrent=0), dict(step_end_overlap=2)):
        with pytest.raises(ValueError):
            OverlapModel(**bad)


def test_engine_schedule_breakdown_adds_up():
    units = SHAPE.unit_params()
    plan = get_preset("zero3")
    sched = schedule_of(units, TOPO, plan, micro_batches=2, units=engine_units(SHAPE))
    assert sched.collectives() == comm_per_step(units, TOPO, plan, micro_batches=2)
    t = step_time(sched, TOPO, SHAPE, micro_batch=2)
    # every call of the merged list is timed once per count
    assert sum(x.calls for x in t.breakdown) == sum(c.count for c in sched.collectives())
    alone = sum(collective_time(c, TOPO) * c.count for c in sched.collectives())
    assert t.comm_s == pytest.approx(alone) and sum(x.seconds for x in t.breakdown) >= alone * (1 - 1e-9)
    # the step is compute + slowdown + the time the compute waited, all of it attributed
    assert t.step_time_s == pytest.approx(t.compute_s + t.slowdown_s + t.exposed_comm_s)
    assert sum(x.exposed_s for x in t.breakdown) == pytest.approx(t.exposed_comm_s)
    # the compute is split over units by their FLOPs: the embedding has none
    assert sched.units[0].unit.flops == 0 and sched.units[1].unit.flops > 0


def test_edge_costs_are_the_first_units_gather_and_reduce_scatter():
    units = SHAPE.unit_params()
    plan = get_preset("zero3")
    edge = edge_costs(units, TOPO, plan, param_bytes=2, reduce_bytes=4)
    assert sorted(c.phase for c in edge) == ["forward", "grad_reduce"]
    full = comm_per_step(units, TOPO, plan, micro_batches=1)
    fwd_bytes = {c.bytes_sent for c in full if c.phase == "forward"}
    assert all(c.count == 1 and (c.phase != "forward" or c.bytes_sent in fwd_bytes) for c in edge)


def test_network_alpha_beta_shares_the_injection_among_the_groups_leaving_a_node():
    # TOPO: 4 devices per node, 2 GB/s injection. One rank per node: 0.5 GB/s each (4 groups share the
    # NICs); all 4 ranks of each node in one ring: the ring leaves the node once, 2 GB/s
    one = Collective(
        "replica_reduce", "all_reduce", "grad_replicas", 2, "network", 10**8, 1, "fp32", 0, False, 2, 1
    )
    four = Collective("forward", "all_gather", "params", 8, "network", 10**8, 1, "bf16", 0, True, 2, 4)
    assert collective_time(one, TOPO) == pytest.approx(2 * 100e-6 + 1e8 / 0.5e9)
    assert collective_time(four, TOPO) == pytest.approx(7 * 100e-6 + 1e8 / 2e9)


def test_last_backward_hides_a_units_cross_replica_reduction_behind_the_earlier_units_backward():
    m, M = 2, 3
    compute = _compute(m, M)
    bwd_unit = compute / M * (2 / 3) / 2  # one unit's backward in one micro-batch
    d = 0.5 * bwd_unit
    rep = Collective("replica_reduce", "reduce_scatter", "optim_scatter", 2, "network", int(d * 1e9), 1,
                     "fp32", message_bytes=1)  # fmt: skip
    assert collective_time(rep, FLAT) == pytest.approx(d, rel=1e-6)
    base = _sched(2, [0, 0], [0, 0], [0, 0], M=M)

    def with_last(on_unit: int) -> StepSchedule:
        units = tuple(
            UnitSteps(u.unit, u.forward, u.backward, u.reduce, 1, 1, (rep,) if i == on_unit else ())
            for i, u in enumerate(base.units)
        )
        return StepSchedule(units, (), M)

    for concurrent in (1, 2, 3):
        o = OverlapModel(compute_slowdown=0.0, concurrent=concurrent)
        # the head (unit 1) finishes its backward first: its reduction runs under unit 0's backward
        hidden = step_time(with_last(1), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=o)
        assert hidden.step_time_s == pytest.approx(compute)
        # the first unit's is the backward's last: nothing is left to hide it
        exposed = step_time(with_last(0), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=o)
        assert exposed.step_time_s == pytest.approx(compute + d)
        # it runs once per step, in the last micro-batch only
        assert sum(x.calls for x in hidden.breakdown if x.phase == "replica_reduce") == 1
    # after the backward (DeepSpeed's step) it is exposed wherever it belongs
    after = StepSchedule(base.units, (rep,), M)
    t = step_time(after, FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=NO_SLOWDOWN)
    assert t.step_time_s == pytest.approx(compute + d)


def test_first_forward_waits_for_its_units_parameter_gather_in_flight_from_the_start():
    m, M = 2, 3
    compute = _compute(m, M)
    fwd_unit = compute / M * (1 / 3) / 2  # one unit's forward in one micro-batch
    d = 0.5 * fwd_unit
    pg = Collective("param_gather", "all_gather", "param_gather", 2, "network", int(d * 1e9), 1, "bf16",
                    message_bytes=1)  # fmt: skip
    base = _sched(2, [0, 0], [0, 0], [0, 0], M=M)

    def with_first(on_units) -> StepSchedule:
        units = tuple(
            UnitSteps(u.unit, u.forward, u.backward, u.reduce, 1, 1, (), (pg,) if i in on_units else ())
            for i, u in enumerate(base.units)
        )
        return StepSchedule(units, (), M)

    o = OverlapModel(compute_slowdown=0.0, concurrent=3)
    # unit 0 computes first: it waits for its gather; unit 1's lands under unit 0's forward
    first = step_time(with_first({0}), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=o)
    assert first.step_time_s == pytest.approx(compute + d)
    second = step_time(with_first({1}), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=o)
    assert second.step_time_s == pytest.approx(compute)
    # both: unit 1's gather queues behind unit 0's and still ends (2d) before unit 0's forward does (d + 2d)
    both = step_time(with_first({0, 1}), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False, overlap=o)
    assert both.step_time_s == pytest.approx(compute + d)
    assert sum(x.calls for x in both.breakdown if x.phase == "param_gather") == 2  # once per step each
    # at the end of the step (DeepSpeed) both are exposed
    after = step_time(StepSchedule(base.units, (pg, pg), M), FLAT, SHAPE, micro_batch=m,
                      checkpoint_activations=False, overlap=o)  # fmt: skip
    assert after.step_time_s == pytest.approx(compute + 2 * d)


def test_engine_schedule_moves_step_end_collectives_into_the_micro_batches_and_deepspeed_does_not():
    from dataclasses import replace

    from zerotopo.placement.schedule import ENGINE, step_schedule

    plan = get_preset("zerotopo")
    units = engine_units(SHAPE)
    eng = step_schedule(units, TOPO, plan, micro_batches=3)
    ds = step_schedule(
        units, TOPO, plan, micro_batches=3,
        options=replace(ENGINE, step_end_in_backward=False, param_gather_in_forward=False),
    )  # fmt: skip
    assert all(u.last_reduce for u in eng.units) and not any(u.last_reduce for u in ds.units)
    assert all(c.overlappable for u in eng.units for c in u.last_reduce)
    assert all(c.phase not in ("replica_reduce", "param_gather") for c in eng.step_end)
    # p = 2: every unit's post-step parameter all-gather is in flight into the first forward
    assert all(u.first_forward and u.first_forward[0].phase == "param_gather" for u in eng.units)
    assert any(c.phase == "param_gather" and not c.overlappable for c in ds.step_end)
    # p = 1 (ZeRO-1): the shard is the weight the forward uses, gathered at the step's end
    z1 = step_schedule(units, TOPO, get_preset("zero1"), micro_batches=3)
    assert not any(u.first_forward for u in z1.units)
    assert any(c.phase == "param_gather" for c in z1.step_end)
    assert any(c.phase == "replica_reduce" and not c.overlappable for c in ds.step_end)
    # the same calls either way: the ledger's view does not depend on when they run
    assert eng.collectives() == ds.collectives()
    # and the step is shorter when they run in the backward
    a = step_time(eng, TOPO, SHAPE, micro_batch=2)
    b = step_time(ds, TOPO, SHAPE, micro_batch=2)
    assert a.step_time_s < b.step_time_s


def test_the_quantizer_is_compute_even_when_the_wire_hides():
    """A quantized gather prefetched under the previous unit's compute hides its wire time, but its
    quantizer passes take the cores the compute runs on: the step grows by them, in the slowdown."""
    from dataclasses import replace

    topo = replace(FLAT, device=replace(FLAT.device, quant_gbps=1.0))
    m, M = 2, 1
    compute = _compute(m, M)
    q_numel = int(0.01 * compute * 1e9 / 4)  # quantizer seconds: 1% of the compute, at 1 GB/s of fp32
    q = q_numel * 4 / 1e9
    g = Collective("forward", "all_gather_int8", "params", 4, "node", 1000, 1, "int8", message_bytes=1,
                   quant_numel=q_numel)  # fmt: skip
    base = _sched(2, [0, 0], [0, 0], [0, 0], M=M)
    units = (base.units[0], UnitSteps(base.units[1].unit, (g,), (), (), 1, 1))
    t = step_time(StepSchedule(units, (), M), topo, SHAPE, micro_batch=m, checkpoint_activations=False,
                  overlap=NO_SLOWDOWN)  # fmt: skip
    assert t.step_time_s == pytest.approx(compute + q)
    assert t.slowdown_s == pytest.approx(q) and t.exposed_comm_s == pytest.approx(0, abs=1e-9)
    # without a quantizer rate nothing is charged
    plain = step_time(StepSchedule(units, (), M), FLAT, SHAPE, micro_batch=m, checkpoint_activations=False,
                      overlap=NO_SLOWDOWN)  # fmt: skip
    assert plain.step_time_s == pytest.approx(compute)
