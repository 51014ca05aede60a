"""The cost model's inputs beyond the bytes: the compute rate, the optimizer step as memory traffic,
DeepSpeed stage 3's fixed costs (host work per module, the fetch window, the separate scales gather),
the deepspeed-zerotopo preset and the second Frontier curve set."""

from __future__ import annotations

import pytest

from zerotopo.cost.bandwidth import curve_set, table_from_mapping
from zerotopo.cost.planner import CostOptions
from zerotopo.cost.time import (
    OptimizerShard,
    OverlapModel,
    RuntimeCosts,
    collective_time,
    optimizer_bytes,
    optimizer_time,
    step_time,
)
from zerotopo.errors import ConfigError
from zerotopo.placement.schedule import ENGINE, Collective, StepSchedule, Unit, UnitSteps
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology, topology_from_mapping
from zerotopo_lab.presets import (
    COST_PRESETS,
    DEEPSPEED_MICS,
    DEEPSPEED_RUNTIME,
    plan_candidates,
    resolve,
    runtime_costs,
)

SHAPE = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
FLAT = topology_from_mapping(
    {
        "name": "flat",
        "device": {"name": "toy", "memory_gib": 1, "peak_tflops": 1e-6, "memory_bandwidth_gbps": 1.0},
        "tiers": [{"name": "node", "fanout": 4, "bandwidth_gbps": 1.0, "latency_us": 0}],
        "network": {"name": "network", "injection_gbps": 4.0, "latency_us": 0},
        "nodes": 2,
    }
)
QUIET = OverlapModel(compute_slowdown=0.0)


def _gathers(units: int, nbytes: int, prefetch: int) -> StepSchedule:
    steps = [
        UnitSteps(
            Unit(f"u{i}", 1, flops=1.0),
            (Collective("forward", "all_gather", "params", 4, "node", nbytes, 1, "bf16"),),
            (),
            (),
            prefetch,
            prefetch,
        )
        for i in range(units)
    ]
    return StepSchedule(tuple(steps), (), 1)


def _compute() -> float:
    return SHAPE.step_flops(1, checkpoint_activations=False) / (1e-6 * 1e12 * 0.5)


def test_achieved_tflops_replaces_the_efficiency():
    s = _gathers(2, 0, 1)
    kw = dict(micro_batch=1, checkpoint_activations=False, overlap=QUIET)
    at_half = step_time(s, FLAT, SHAPE, **kw)
    measured = step_time(s, FLAT, SHAPE, achieved_tflops=0.25e-6, **kw)  # half the efficiency-0.5 rate
    assert measured.compute_s == pytest.approx(2 * at_half.compute_s)
    assert measured.mfu == pytest.approx(at_half.mfu / 2)  # MFU stays against the device's peak
    with pytest.raises(ValueError, match="achieved_tflops"):
        step_time(s, FLAT, SHAPE, achieved_tflops=0.0, **kw)


def test_optimizer_step_is_memory_traffic_over_the_declared_bandwidth():
    # norm read (4) + unscale-and-clip read/write (8) + AdamW reads grad, master, m, v (16) and writes
    # master, m, v (12) and the bf16 copy (2): 42 bytes per element with fp32 gradients
    assert optimizer_bytes(4, 2) == 42 and optimizer_bytes(2, 2) == 34
    shard = OptimizerShard(numel=10**6, grad_bytes=4, param_bytes=2)
    assert optimizer_time(shard, FLAT) == pytest.approx(42e6 / 1e9)
    t = step_time(_gathers(2, 0, 1), FLAT, SHAPE, micro_batch=1, checkpoint_activations=False,
                  overlap=QUIET, optimizer=shard)  # fmt: skip
    assert t.optimizer_s == pytest.approx(0.042)
    assert t.step_time_s == pytest.approx(_compute() + 0.042) and t.exposed_comm_s == pytest.approx(0)
    # a topology that does not declare its memory bandwidth prices no optimizer step
    assert optimizer_time(shard, load_topology("emulated")) == 0.0


def test_host_work_per_unit_bounds_each_units_compute():
    k = _compute() / 2  # one unit's compute (forward + backward)
    host = 3 * k  # a third of it in the forward (k: the unit's whole forward is k/3), two thirds backward
    t = step_time(_gathers(2, 0, 1), FLAT, SHAPE, micro_batch=1, checkpoint_activations=False,
                  overlap=QUIET, runtime=RuntimeCosts(host_s_per_unit=host))  # fmt: skip
    assert t.step_time_s == pytest.approx(2 * host) and t.host_s == pytest.approx(2 * host - _compute())
    assert t.exposed_comm_s == pytest.approx(0)


def test_fetch_window_caps_the_prefetch_depth():
    k = _compute() / 3 / 4  # forward compute of one of four units
    g = int(k * 1e9)  # each gather as long as a unit's forward
    deep = _gathers(4, g, 3)
    kw = dict(micro_batch=1, checkpoint_activations=False, overlap=QUIET)
    free = step_time(deep, FLAT, SHAPE, **kw).step_time_s
    capped = step_time(deep, FLAT, SHAPE, runtime=RuntimeCosts(fetch_window=1), **kw).step_time_s
    assert capped == pytest.approx(step_time(_gathers(4, g, 1), FLAT, SHAPE, **kw).step_time_s)
    assert free <= capped
    with pytest.raises(ValueError, match="fetch_window"):
        RuntimeCosts(fetch_window=0)


def test_separate_scales_gather_pays_a_second_latency():
    topo = load_topology("frontier", nodes=2)
    n, d = 1 << 20, 16
    c = Collective("forward", "all_gather_int8", "params", d, "network", n * (d - 1) // d, 1, "int8",
                   message_bytes=n + n // 256 * 4, nodes=2, ranks_per_node=8, quant_numel=n + n // d)  # fmt: skip
    from zerotopo.cost.time import _timer

    one = collective_time(c, topo)
    two = _timer(topo, None, RuntimeCosts(scale_gather=True))(c)
    # alpha-beta: the same bytes, one more ring of d-1 latency steps
    assert two - one == pytest.approx((d - 1) * topo.latency_us("network") * 1e-6, rel=0.02)


def test_deepspeed_runtime_costs_apply_to_its_stage3_schedules_only():
    assert runtime_costs(COST_PRESETS["deepspeed-zero3"][1]) == DEEPSPEED_RUNTIME
    assert runtime_costs(COST_PRESETS["deepspeed-zero1"][1]) == RuntimeCosts()
    assert runtime_costs(ENGINE) == RuntimeCosts()
    assert DEEPSPEED_RUNTIME.fetch_window == 2 and DEEPSPEED_RUNTIME.scale_gather


def test_deepspeed_zerotopo_preset_is_the_papers_placement_on_deepspeed():
    plan, sched = resolve("deepspeed-zerotopo")
    assert sched == DEEPSPEED_MICS and plan.grad_reduce == "allreduce" and plan.grad_dtype == "param"
    topo = load_topology("frontier", nodes=2)
    d = plan.degrees(topo)
    assert (d.params, d.grads, d.optim, d.secondary) == (2, 8, 16, 8)
    (e,) = plan_candidates(SHAPE, topo, plans=["deepspeed-zerotopo"], options=CostOptions())
    ops = {(c.phase, c.op, c.group) for c in e.comm}
    # the node's gradient shard all-reduced across the nodes, not reduce-scattered over the optimizer
    assert ("replica_reduce", "all_reduce", "grad_replicas") in ops
    assert not any(c.group == "optim_scatter" for c in e.comm)


def test_rdzv0_curve_set_is_the_reproducers_fr_reduce_scatter_runs():
    t = curve_set("frontier", "rdzv0")
    # data/frontier/fr_reduce_scatter/slurm-2990838.out: 64 nodes, 64 MiB, 3.875 GB/s (0.384 with defaults)
    assert t.busbw("reduce_scatter", 64 << 20, "network", 64, 8) == pytest.approx(3.875)
    assert curve_set("frontier", "default").busbw(
        "reduce_scatter", 64 << 20, "network", 64, 8
    ) == pytest.approx(0.384)
    # no all-gather runs with these settings: all-gathers read the reduce-scatter curves
    assert t.busbw("all_gather", 64 << 20, "network", 64, 8) == pytest.approx(3.875)
    assert {c.op for c in t.curves} == {"reduce_scatter"} and all(c.source for c in t.curves)


def test_unknown_curve_set_and_bad_fallback_are_named():
    with pytest.raises(ConfigError, match="no curve set 'nope'.*sets: default, rdzv0"):
        curve_set("frontier", "nope")
    with pytest.raises(ConfigError, match="no curve set 'frontier' for topology 'emulated'"):
        curve_set("emulated", "frontier")  # emulated-frontier.yaml is another topology's table
    with pytest.raises(ConfigError, match="fallback"):
        table_from_mapping({"topology": "x", "bandwidth": [], "fallback": {"all_gather": "nccl"}})


def test_a_deepspeed_presets_alternative_without_secondary_stays_on_deepspeeds_schedule():
    from dataclasses import replace

    from zerotopo.cost.planner import secondary_alternative
    from zerotopo_lab.papers import neox_20b

    shape, base = neox_20b()
    topo = load_topology("frontier", nodes=48)
    o = replace(base, micro_batch=4)
    (e,) = plan_candidates(shape, topo, plans=["deepspeed-zerotopo"], options=o)
    alt, why = secondary_alternative(e, shape, topo, o)
    assert alt.name == "deepspeed-zerotopo-nosec" and alt.schedule.options == DEEPSPEED_MICS
    assert why.startswith("deepspeed-zerotopo: its 8-rank int8 secondary partition")
    # on DeepSpeed's schedule the two are within 0.5% of each other, far from the engine's figure
    assert alt.time.step_time_s == pytest.approx(e.time.step_time_s, rel=0.005)
