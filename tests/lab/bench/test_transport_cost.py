"""CPU ranks' transport: the cost model charges each overlapped collective call the compute time its
processor work takes (per call and per MB sent), and ``bench compare`` fits those figures from a probe."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerotopo.cost.planner import CostOptions, estimate
from zerotopo.cost.time import OverlapModel, transport_time
from zerotopo.errors import ConfigError
from zerotopo.placement.plan import get_preset
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology, topology_from_mapping
from zerotopo_lab.bench.transport import Transport, fit

PER_CALL_US, PER_MB_US = 4000.0, 1500.0


def _fast(topo):
    """``topo`` with links so fast that no collective shows: what the compute stream owes is all that
    moves the step."""
    tiers = tuple(replace(t, bandwidth_gbps=1e6, latency_us=1e-6) for t in topo.tiers)
    network = replace(topo.network, injection_gbps=1e6, latency_us=1e-6)
    return replace(topo, tiers=tiers, network=network)


def _with(topo, per_call: float, per_mb: float):
    return replace(
        topo, device=replace(topo.device, comm_cpu_us_per_call=per_call, comm_cpu_us_per_mb=per_mb)
    )


def test_transport_time_is_the_devices_figures_per_call_and_per_mb():
    topo = load_topology("emulated-frontier")
    est = estimate(get_preset("zero3"), _shape(), topo, _opts())
    c = est.schedule.units[0].forward[0]
    assert transport_time(c, topo) == 0.0  # a device without the figures (every GPU) is not charged
    charged = _with(topo, PER_CALL_US, PER_MB_US)
    assert transport_time(c, charged) == pytest.approx((PER_CALL_US + PER_MB_US * c.bytes_sent / 1e6) * 1e-6)


def _shape() -> ModelShape:
    return ModelShape(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=128, vocab_size=2048)


def _opts() -> CostOptions:
    return CostOptions(micro_batch=2, grad_accum=1, efficiency=1.0, default_bandwidth=False,
                       overlap=OverlapModel(compute_slowdown=0.0, host_reduce=True))  # fmt: skip


@pytest.mark.parametrize("preset", ["zero3", "mics", "zerotopo"])
def test_each_overlapped_call_lengthens_the_compute_by_its_transport(preset):
    """On links too fast to show, a step is its compute plus what the transport of every call in the
    micro-batch takes from it; the step-end collectives (the ranks wait for them anyway) are not charged."""
    topo = _fast(load_topology("emulated-frontier"))
    shape, opts = _shape(), _opts()
    plain = estimate(get_preset(preset), shape, topo, opts)
    charged_topo = _with(topo, PER_CALL_US, PER_MB_US)
    charged = estimate(get_preset(preset), shape, charged_topo, opts)
    calls = [c for u in plain.schedule.units for c in u.forward + u.backward + u.reduce + u.first_forward
             + u.last_reduce]  # fmt: skip
    assert calls and plain.schedule.micro_batches == 1
    owed = sum(transport_time(c, charged_topo) for c in calls)
    assert owed > 0.01
    assert charged.time.step_time_s - plain.time.step_time_s == pytest.approx(owed, rel=1e-3)
    assert charged.time.slowdown_s - plain.time.slowdown_s == pytest.approx(owed, rel=1e-3)
    # more calls of the same bytes cost more: a per-call charge alone orders plans by their call counts
    per_call_only = estimate(get_preset(preset), shape, _with(topo, PER_CALL_US, 0.0), opts)
    assert per_call_only.time.step_time_s - plain.time.step_time_s == pytest.approx(
        len(calls) * PER_CALL_US * 1e-6, rel=1e-3
    )


def test_a_device_with_transport_figures_is_not_also_slowed_per_second_in_flight():
    # the transport figures replace the GPU's interference figure: with the default overlap model (a
    # slowdown of 0.189), a device declaring them is priced as with a slowdown of 0 in the simulation and
    # in the planner's bound, so `zerotopo plan` charges the processor time once; without them the
    # slowdown applies
    from zerotopo.cost.planner import plan_candidates

    topo = load_topology("emulated-frontier")
    shape = _shape()
    gpu_like = replace(_opts(), overlap=OverlapModel(host_reduce=True))
    no_slowdown = _opts()
    for charged in (_with(topo, PER_CALL_US, PER_MB_US), _with(topo, 0.0, PER_MB_US)):
        a = estimate(get_preset("zero3"), shape, charged, gpu_like).time
        b = estimate(get_preset("zero3"), shape, charged, no_slowdown).time
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    plain = estimate(get_preset("zero3"), shape, topo, gpu_like).time
    assert plain.step_time_s > estimate(get_preset("zero3"), shape, topo, no_slowdown).time.step_time_s
    # the planner's pruned search over such a device returns the plans the full costing ranks first
    charged = _with(topo, PER_CALL_US, PER_MB_US)
    found = plan_candidates(shape, charged, plans="auto", options=gpu_like)
    best = min(found, key=lambda e: e.time.step_time_s)
    assert best.time.step_time_s == pytest.approx(
        estimate(best.plan, shape, charged, no_slowdown).time.step_time_s, rel=1e-12
    )


def test_topology_files_declare_the_transport_figures():
    raw = {
        "name": "t",
        "device": {"name": "d", "memory_gib": 1, "peak_tflops": 1, "comm_cpu_us_per_call": 120.5},
        "tiers": [{"name": "node", "fanout": 2, "bandwidth_gbps": 1, "latency_us": 1}],
        "network": {"name": "network", "injection_gbps": 1, "latency_us": 1},
    }
    dev = topology_from_mapping(raw).device
    assert (dev.comm_cpu_us_per_call, dev.comm_cpu_us_per_mb) == (120.5, 0.0)
    for key, bad in (
        ("comm_cpu_us_per_call", -1),
        ("comm_cpu_us_per_mb", "fast"),
        ("comm_cpu_us_per_mb", 1e12),
    ):
        raw["device"] = {"name": "d", "memory_gib": 1, "peak_tflops": 1, key: bad}
        with pytest.raises(ConfigError, match=key):
            topology_from_mapping(raw)


def _probe_rows(per_call: float, per_byte: float, ranks: int = 3) -> list[list[tuple[str, int, float]]]:
    sizes = [("all_gather", 100_000), ("reduce_scatter", 100_000), ("all_reduce", 200_000),
             ("all_gather", 2_000_000), ("reduce_scatter", 2_000_000), ("all_reduce", 4_000_000)]  # fmt: skip
    # the ranks scatter around the line; their median is on it
    return [
        [(op, b, per_call + per_byte * b + (r - ranks // 2) * 1e-4) for op, b in sizes] for r in range(ranks)
    ]


def test_fit_takes_the_median_rank_and_scales_by_the_ranks_sharing_a_core():
    t = fit(_probe_rows(0.003, 2e-9), world=8, n_cores=2)
    assert isinstance(t, Transport) and t.ranks_per_core == 4
    assert t.per_call_s == pytest.approx(4 * 0.003) and t.per_byte_s == pytest.approx(4 * 2e-9)
    assert t.device_fields() == pytest.approx({"comm_cpu_us_per_call": 12000.0, "comm_cpu_us_per_mb": 8000.0})
    d = t.to_dict()
    assert d["us_per_call"] == 12000.0 and d["us_per_mb"] == 8000.0 and len(d["probe"]) == 6
    # a rank per core (or more cores than ranks): the processor time is the compute lost, no more
    assert fit(_probe_rows(0.003, 2e-9), world=8, n_cores=16).per_call_s == pytest.approx(0.003)
    # a probe whose larger messages cost less never prices bytes as a gain
    flat = fit([[("all_gather", 1000, 0.004), ("all_gather", 10**6, 0.003)]], world=2, n_cores=2)
    assert flat.per_byte_s == 0.0 and flat.per_call_s == pytest.approx(0.0035)
    with pytest.raises(ValueError, match="no probe samples"):
        fit([], world=8)
