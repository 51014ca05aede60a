"""The engine's schedule describes the engine only; DeepSpeed's is a schedule model beside it that emits
the same StepSchedule and adds behaviour only through its own knobs."""

from __future__ import annotations

import dataclasses

import pytest

from zerotopo.config.model_files import load_model
from zerotopo.placement.plan import get_preset
from zerotopo.placement.schedule import (
    ENGINE,
    ScheduleOptions,
    engine_unit_steps,
    engine_units,
    step_schedule,
)
from zerotopo.placement.topology import load_topology
from zerotopo_lab.deepspeed_schedule import DeepSpeedSchedule, module_units

#: A DeepSpeed schedule with every knob where the engine stands.
LIKE_ENGINE = DeepSpeedSchedule(
    step_end_in_backward=True, param_gather_in_forward=True, secondary_param_dtype=False
)


def test_the_engines_schedule_options_are_the_engines_knobs_only():
    fields = {f.name for f in dataclasses.fields(ScheduleOptions)}
    assert fields == {"name", "unit_layers", "step_end_in_backward", "param_gather_in_forward", "description"}
    assert ENGINE.runtime is None and not ENGINE.hold_gathered and ENGINE.per_unit


@pytest.mark.parametrize("preset", ["zero3", "zeropp", "zerotopo", "mics", "zero1"])
@pytest.mark.parametrize("fp16", [False, True])
def test_deepspeeds_model_with_the_engines_settings_builds_the_engines_schedule(preset, fp16):
    shape, _ = load_model(["neox-125m"], None)
    topo = load_topology("frontier", nodes=2)
    units = engine_units(shape)
    kw = dict(micro_batches=3, param_bytes=2, reduce_bytes=4, grad_shard_bytes=4, fp16=fp16)
    engine = step_schedule(units, topo, get_preset(preset), **kw)
    other = step_schedule(units, topo, get_preset(preset), options=LIKE_ENGINE, **kw)
    assert other.units == engine.units and other.step_end == engine.step_end
    assert other.collectives() == engine.collectives()


def test_each_deepspeed_knob_changes_the_schedule():
    shape, _ = load_model(["neox-125m"], None)
    topo = load_topology("frontier", nodes=2)
    units = module_units(shape, 0)
    plan = get_preset("zeropp")
    base = step_schedule(units, topo, plan, micro_batches=2, options=LIKE_ENGINE)
    knobs = {
        "reduce_bucket_elems": 10**7,
        "prefetch_bucket_elems": 10**6,
        "step_end_in_backward": False,
        "param_gather_in_forward": False,
        "secondary_param_dtype": True,
        "backward_gather": False,
        "hpz_forward": True,
    }
    for k, v in knobs.items():
        changed = step_schedule(
            units, topo, plan, micro_batches=2, options=dataclasses.replace(LIKE_ENGINE, **{k: v})
        )
        assert changed != base, k
    # the gloo reduce-scatter shows on an unquantized ZeRO-3, the all-gather buckets on ZeRO-1's step end
    z3 = get_preset("zero3")
    gloo = dataclasses.replace(LIKE_ENGINE, reduce_scatter_all_reduce=True)
    for sched, op in ((LIKE_ENGINE, "reduce_scatter"), (gloo, "all_reduce")):
        built = step_schedule(units, topo, z3, micro_batches=2, options=sched).collectives()
        assert {c.op for c in built if c.phase == "grad_reduce"} == {op}
    at_end = dataclasses.replace(LIKE_ENGINE, param_gather_in_forward=False)
    z1 = get_preset("zero1")
    whole = step_schedule(units, topo, z1, micro_batches=2, options=at_end)
    bucketed = step_schedule(
        units, topo, z1, micro_batches=2, options=dataclasses.replace(at_end, allgather_bucket_elems=10**7)
    )
    calls = lambda s: sum(c.count for c in s.collectives() if c.phase == "param_gather")  # noqa: E731
    assert calls(whole) == len(units) and calls(bucketed) == -(-sum(u.numel for u in units) // 10**7)


def test_deepspeed_has_no_layers_per_unit_to_choose():
    with pytest.raises(ValueError, match="per module"):
        LIKE_ENGINE.with_unit_layers(2)
    assert LIKE_ENGINE.unit_layers is None and ENGINE.with_unit_layers(3).unit_layers == 3


def test_every_engine_unit_gets_a_backward_gather_to_execute():
    """The runtime is given a backward gather for every unit, the last included (it skips the gather for a
    unit still full): no placeholder unit is needed to get one."""
    topo = load_topology("frontier", nodes=2)
    plan = get_preset("zero3")
    steps = engine_unit_steps(
        [4096, 8192, 4096], topo, plan, degrees=plan.degrees(topo), param_bytes=2, reduce_bytes=4,
        grad_shard_bytes=4,
    )  # fmt: skip
    assert len(steps) == 3 and all(s.backward for s in steps)
    costed = step_schedule(engine_units(load_model(["neox-125m"], None)[0]), topo, plan, micro_batches=1)
    assert not costed.units[-1].backward and all(u.backward for u in costed.units[:-1])


def test_deepspeeds_prefetch_gathers_its_modules_in_one_call_as_traced():
    """DeepSpeed's coordinator prefetches from its trace while fewer than the bucket's elements are queued,
    in one call: at the bench's size (bucket over the whole model) the root module's prefetch is the
    step's only forward gather; at NeoX-20B's (5e7 against 113M-151M modules) the attention output
    (38M) shares its call with the first MLP matrix."""
    from zerotopo_lab.deepspeed_schedule import fetch_calls

    assert fetch_calls([10, 20, 0, 30], 100) == [(-1, [0, 1, 3])]
    neox = [309, 113, 38, 151, 151, 113, 38, 151, 151, 309]
    assert fetch_calls(neox, 50) == [
        (-1, [0]), (0, [1]), (1, [2, 3]), (2, [4]), (3, [5]), (4, [6, 7]), (5, [8]), (6, [9]),
    ]  # fmt: skip
    # a bucket smaller than a module: each fetch prefetches the next module, one call each
    assert fetch_calls([5, 5], 1) == [(-1, [0]), (0, [1])]

    shape, _ = load_model(["neox-125m"], None)
    topo = load_topology("frontier", nodes=2)
    units = module_units(shape, 0)
    plan = get_preset("zero3")
    wide = dataclasses.replace(LIKE_ENGINE, prefetch_bucket_elems=10**12, param_gather_in_forward=False)
    per_module = step_schedule(units, topo, plan, micro_batches=1, options=wide)
    one = step_schedule(
        units, topo, plan, micro_batches=1, options=dataclasses.replace(wide, coalesce_prefetch=True)
    )
    fwd = lambda s: [c for u in s.units for c in u.forward]  # noqa: E731
    assert len(fwd(per_module)) == len(units) and len(fwd(one)) == 1
    assert one.units[0].forward and not any(u.forward for u in one.units[1:])
    # the same bytes in one message
    assert fwd(one)[0].bytes_sent == pytest.approx(sum(c.bytes_sent for c in fwd(per_module)), rel=1e-3)
    assert one.units[1:] != per_module.units[1:] and one.step_end == per_module.step_end


def test_a_coalesced_prefetch_is_waited_for_in_full_before_the_first_module():
    from zerotopo.cost.time import collective_time, step_time

    shape, _ = load_model(["neox-125m"], None)
    topo = load_topology("frontier", nodes=2)
    units = module_units(shape, 0)
    plan = get_preset("zero3")
    wide = dataclasses.replace(
        LIKE_ENGINE, prefetch_bucket_elems=10**12, param_gather_in_forward=False, backward_gather=False
    )
    times = {}
    for coalesce in (False, True):
        sched = step_schedule(
            units, topo, plan, micro_batches=1, options=dataclasses.replace(wide, coalesce_prefetch=coalesce)
        )
        times[coalesce] = step_time(sched, topo, shape, micro_batch=1)
    gather = collective_time(
        step_schedule(units, topo, plan, micro_batches=1,
                      options=dataclasses.replace(wide, coalesce_prefetch=True)).units[0].forward[0], topo,
    )  # fmt: skip
    # per module, the gathers after the first hide behind compute; coalesced, the one gather is all exposed
    fwd = {k: [s for s in t.breakdown if s.phase == "forward"] for k, t in times.items()}
    assert [s.calls for s in fwd[True]] == [1] and fwd[True][0].exposed_s == pytest.approx(gather)
    assert sum(s.calls for s in fwd[False]) == len(units)
    assert sum(s.exposed_s for s in fwd[False]) < sum(s.seconds for s in fwd[False])
    assert times[True].step_time_s >= times[True].compute_s + gather


def test_deepspeeds_hpz_gathers_from_its_copy_after_the_first_micro_batch():
    """DeepSpeed gathers from the hpZ copy whenever it exists (made at a module's first release in a step,
    dropped at the optimizer step): the first micro-batch's forward gathers over the job, the later
    ones' within the node. Priced and counted so; a step of one micro-batch is unchanged."""
    from zerotopo.cost.planner import CostOptions, _lower_bound
    from zerotopo.cost.time import step_time
    from zerotopo_lab.bench.compare import framework_cost
    from zerotopo_lab.bench.ringbytes import ring_tier_bytes

    shape, _ = load_model(["neox-125m"], None)
    topo = load_topology("emulated-frontier", nodes=2)
    plan, row = framework_cost("deepspeed-hpz")
    assert row.hpz_forward  # (on the ZeRO-3 row too, where no copy exists to read)
    units = row.units(shape)
    kw = dict(param_bytes=2, reduce_bytes=2, grad_shard_bytes=4, fp16=False)
    built = {
        (on, m): step_schedule(
            units, topo, plan, micro_batches=m, options=dataclasses.replace(row, hpz_forward=on), **kw
        )
        for on in (False, True)
        for m in (1, 4)
    }
    assert built[True, 1].collectives() == built[False, 1].collectives()
    fwd = {k: [c for c in s.collectives() if c.phase == "forward"] for k, s in built.items()}
    calls = sum(c.count for c in fwd[False, 1])
    assert calls >= 1 and {c.group for c in fwd[False, 4]} == {"params"}
    assert sum(c.count for c in fwd[True, 4] if c.group == "params") == calls
    within = [c for c in fwd[True, 4] if c.group == "secondary"]
    assert sum(c.count for c in within) == 3 * calls and all(c.nodes == 1 for c in within)
    # per tier, hop by hop: three of the four micro-batches' forward gathers leave the network
    degrees = plan.degrees(topo)
    net = lambda s: ring_tier_bytes(s, topo, degrees)["network"]  # noqa: E731

    def phase_net(phase: str) -> float:  # one micro-batch's calls of ``phase`` over the job
        calls = [c for c in built[False, 1].collectives() if c.phase == phase for _ in range(c.count)]
        return net(dataclasses.replace(built[False, 1], micro_batches=1, units=(), step_end=tuple(calls)))

    gather, reduce = phase_net("forward"), phase_net("grad_reduce")
    assert gather > 0 and reduce > 0
    assert net(built[True, 4]) == pytest.approx(net(built[False, 4]) - 3 * gather, rel=1e-9)
    assert net(built[True, 4]) - net(built[True, 1]) == pytest.approx(3 * reduce, rel=1e-9)
    # the step: faster by the gathers kept in the node, never below the planner's bound
    opts = CostOptions(micro_batch=1, grad_accum=4)
    times = {k: step_time(s, topo, shape, micro_batch=1).step_time_s for k, s in built.items()}
    assert times[True, 1] == times[False, 1] and times[True, 4] < times[False, 4]
    assert _lower_bound(built[True, 4], shape, topo, opts) <= times[True, 4]
