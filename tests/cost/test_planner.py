"""The planner against an independent exhaustive search on small machines."""

from __future__ import annotations

import itertools

import pytest

from zerotopo.cost.comm import comm_per_step, schedule_of
from zerotopo.cost.memory import memory_per_device
from zerotopo.cost.planner import (
    AUTO_TOP,
    TIE,
    CostOptions,
    best_plan,
    is_tier_aligned,
    pick,
    placement,
    plan_candidates,
)
from zerotopo.cost.time import step_time
from zerotopo.placement.plan import PRESETS, Plan
from zerotopo.placement.schedule import engine_units
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology, topology_from_mapping

SHAPE = ModelShape(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256)


def _quad(nodes: int):
    """A 4-device node: 2 packages of 2 devices."""
    return topology_from_mapping(
        {
            "name": "quad",
            "device": {"name": "toy", "memory_gib": 1, "peak_tflops": 0.001},
            "tiers": [
                {"name": "package", "fanout": 2, "bandwidth_gbps": 8, "latency_us": 5},
                {"name": "node", "fanout": 2, "bandwidth_gbps": 2, "latency_us": 10},
            ],
            "network": {"name": "network", "injection_gbps": 2, "latency_us": 50},
            "nodes": nodes,
        }
    )


def _space(topo):
    """Every plan of the planner's documented search space, written out independently of plan.py."""
    w = topo.world_size
    sizes = [2, 4]  # package, node
    degs = [d for d in range(1, w + 1) if w % d == 0 and all(t % d == 0 or d % t == 0 for t in sizes)]
    for p, g, o in itertools.product(degs, repeat=3):
        if g % p or o % g:
            continue
        secondaries = [(None, "bf16")] + [
            (s, dt) for s in degs if s <= p for dt in ("bf16", "int8") if not (s == p and dt == "bf16")
        ]
        for (s, dt), qw, qg in itertools.product(secondaries, (False, True), (False, True)):
            if (qw and p == 1 and s is None) or (qg and g == 1):
                continue  # a quantized collective that would not run
            yield Plan(
                f"x{p}.{s}.{g}.{o}",
                params=p,
                grads=g,
                optim=o,
                secondary=s,
                secondary_dtype=dt,
                quantize_weights=qw,
                quantize_grads=qg,
            )


def _cost(plan, topo, opts):
    units = SHAPE.unit_params()
    mem = memory_per_device(units, topo, plan, micro_batch=opts.micro_batch, shape=SHAPE)
    sched = schedule_of(units, topo, plan, micro_batches=opts.grad_accum, units=engine_units(SHAPE))
    # the schedule's merged view is the ledger's: what comm_per_step returns
    assert sched.collectives() == comm_per_step(units, topo, plan, micro_batches=opts.grad_accum)
    t = step_time(sched, topo, SHAPE, micro_batch=opts.micro_batch)
    return mem.total, t.step_time_s


@pytest.mark.parametrize("nodes", [1, 2])
def test_planner_matches_an_exhaustive_search(nodes):
    topo = _quad(nodes)
    probe = CostOptions(micro_batch=2, grad_accum=2)
    costs = {placement(p, topo): _cost(p, topo, probe) for p in _space(topo)}
    for p in PRESETS.values():
        costs.setdefault(placement(p, topo), _cost(p, topo, probe))
    # a memory limit between the smallest and the largest plan, so both fits and misses occur
    totals = sorted(m for m, _ in costs.values())
    limit = totals[len(totals) // 2]
    opts = CostOptions(micro_batch=2, grad_accum=2, memory_limit_bytes=limit)
    est = plan_candidates(SHAPE, topo, plans="all", options=opts)
    # no valid plan missing, none twice, none extra
    assert sorted(map(repr, (placement(e.plan, topo) for e in est))) == sorted(map(repr, costs))
    for e in est:
        mem, t = costs[placement(e.plan, topo)]
        assert e.memory.total == mem and e.time.step_time_s == pytest.approx(t)
        assert e.fits == (mem <= limit)
        if e.fits:
            assert e.memory.total <= limit
    # the planner's best is the exhaustive minimum over fitting plans
    best = best_plan(est)
    assert best is est[0]
    assert best.time.step_time_s == pytest.approx(min(t for m, t in costs.values() if m <= limit))
    # fitting plans first, each group by step time
    flags = [e.fits for e in est]
    assert flags == sorted(flags, reverse=True)
    fit_times = [e.time.step_time_s for e in est if e.fits]
    assert fit_times == sorted(fit_times)


def test_auto_presets_and_named_lists():
    topo = load_topology("emulated")
    opts = CostOptions(micro_batch=1, grad_accum=2)
    presets = plan_candidates(SHAPE, topo, plans="presets", options=opts)
    names = {e.name for e in presets}
    assert "hsdp" not in names and {"zero3", "zeropp", "mics", "zerotopo", "ddp"} <= names  # hsdp == mics
    auto = plan_candidates(SHAPE, topo, plans="auto", options=opts)
    lins = [e for e in auto if e.name not in PRESETS]
    assert 0 < len(lins) <= AUTO_TOP and all(e.fits for e in lins)
    picked = plan_candidates(SHAPE, topo, plans="zero3,zeropp", options=opts)
    assert sorted(e.name for e in picked) == ["zero3", "zeropp"]
    assert plan_candidates(SHAPE, topo, plans=["zero++"], options=opts)[0].name == "zeropp"


@pytest.mark.slow
def test_alignment_filter():
    f = load_topology("frontier", nodes=48)
    assert [d for d in (1, 2, 3, 4, 6, 8, 12, 16, 24, 384) if is_tier_aligned(d, f)] == [
        1,
        2,
        4,
        8,
        16,
        24,
        384,
    ]
    topo = load_topology("frontier", nodes=3)  # 24 ranks: 3, 6 and 12 are not tier-aligned
    degs = {
        placement(e.plan, topo)[0].params for e in plan_candidates(SHAPE, topo, plans="all", micro_batch=1)
    }
    assert degs == {1, 2, 4, 8, 24}
    every = plan_candidates(SHAPE, topo, plans="all", aligned=False, micro_batch=1)
    assert {placement(e.plan, topo)[0].params for e in every} == {1, 2, 3, 4, 6, 8, 12, 24}
    # a 12-rank group straddles nodes for some ranks: costed on the network, its slowest tier
    e = next(x for x in every if placement(x.plan, topo)[0].params == 12 and not x.plan.quantize_weights)
    assert {c.tier for c in e.comm if c.phase == "forward"} == {"network"}


def test_json_record_keys():
    topo = load_topology("emulated")
    e = plan_candidates(SHAPE, topo, plans=["zerotopo"], micro_batch=1)[0]
    rec = e.to_json(topo)
    assert {
        "name",
        "degrees",
        "memory_bytes",
        "comm_bytes",
        "step_time_s",
        "tflops_per_device",
        "fits",
    } <= set(rec)
    assert {"params", "secondary", "grads", "optim", "total"} <= set(rec["memory_bytes"])
    assert set(rec["comm_bytes"]) == {"package", "node", "network"}
    assert rec["degrees"] == "p=2 s=4/int8 g=4 o=8 qw8 qg4"


def test_planner_chooses_the_unit_size():
    topo = load_topology("frontier", nodes=2)
    base = CostOptions(micro_batch=2, grad_accum=2)
    free = CostOptions(micro_batch=2, grad_accum=2, unit_layers=(1, 3))
    for name in ("zero3", "zerotopo"):
        one = plan_candidates(SHAPE, topo, plans=[name], options=base)[0]
        three = plan_candidates(
            SHAPE, topo, plans=[name], options=CostOptions(micro_batch=2, grad_accum=2, unit_layers=(3,))
        )[0]
        chosen = plan_candidates(SHAPE, topo, plans=[name], options=free)[0]
        assert one.unit_layers == 1 and three.unit_layers == 3
        # three layers per unit: one unit for the layers, larger messages and larger buffers
        assert len(three.schedule.units) == 3 and three.memory.buffers > one.memory.buffers
        assert three.comm_bytes == one.comm_bytes or name == "zerotopo"
        best = min((one, three), key=lambda e: (not e.fits, e.time.step_time_s))
        assert chosen.unit_layers == best.unit_layers and chosen.time.step_time_s == pytest.approx(
            best.time.step_time_s
        )
        assert chosen.to_json(topo)["unit_layers"] == chosen.unit_layers
    # DeepSpeed's per-module schedule (the lab's, given as a plan and its schedule) has no unit size to choose
    from zerotopo_lab.presets import COST_PRESETS

    assert (
        plan_candidates(SHAPE, topo, plans=[COST_PRESETS["deepspeed-zero3"]], options=free)[0].unit_layers
        is None
    )


def test_the_pick_takes_the_smallest_plan_within_the_tie():
    # `zerotopo plan`'s recommendation and the bench's planner row pick alike: among the plans within
    # TIE of the fastest, the one needing least memory; a plan just outside the tie loses to the fastest
    from dataclasses import replace

    topo = _quad(1)
    ests = sorted(plan_candidates(SHAPE, topo, plans="auto"), key=lambda e: e.time.step_time_s)
    fast, small = ests[0], min(ests, key=lambda e: e.memory.total)
    assert small.memory.total < fast.memory.total
    t = fast.time.step_time_s

    def at(e, step):
        return replace(e, time=replace(e.time, step_time_s=step))

    assert pick([fast, at(small, t * (1 + TIE / 2))]).plan == small.plan
    assert pick([fast, at(small, t * (1 + 2 * TIE))]).plan == fast.plan
    # another step measure (the bench's, with its replayed waits) decides instead of the prediction
    assert pick([fast, small], lambda e: 1.0 if e is small else 2.0).plan == small.plan
