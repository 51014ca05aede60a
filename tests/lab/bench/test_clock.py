"""The emulated device clock's arithmetic: unit device times, the dilation, the shaped links' rates and
delays, and the machine the cost model prices it on (one process, milliseconds)."""

from __future__ import annotations

import pytest

from zerotopo.config.model_files import load_model
from zerotopo.cost.time import optimizer_bytes
from zerotopo.placement.topology import load_topology
from zerotopo_lab.bench.clock import (
    DeviceClock,
    arithmetic_fraction,
    dilation,
    emulated_device,
    link_delays_ms,
    link_rates_mbit,
    target_topology,
    unit_forward_times,
)


@pytest.fixture(scope="module")
def neox20b():
    shape, _ = load_model(["configs/neox-20b.yml"], None)
    return shape


def test_a_units_forward_is_its_flops_at_peak_times_efficiency(neox20b):
    t = unit_forward_times(neox20b, 8192, peak_tflops=191.5, hbm_gbps=1600, efficiency=0.5)
    layer = neox20b.layer_unit().flops_per_token * 8192 / (191.5e12 * 0.5)
    assert t["layer"] == pytest.approx(layer)
    assert t["head"] == pytest.approx(neox20b.head_unit().flops_per_token * 8192 / 95.75e12)
    # NeoX-20B (hidden 6144, 44 layers): ~0.96 GFLOP per token per layer, 82 ms per layer for 8192 tokens
    assert 0.07 < t["layer"] < 0.09
    # the embedding computes nothing: it moves its rows (bf16 in and out) at the HBM bandwidth
    assert t["embedding"] == pytest.approx(2 * 8192 * 6144 * 2 / 1.6e12)
    with pytest.raises(ValueError, match="peak_tflops"):
        unit_forward_times(neox20b, 8192, peak_tflops=0, hbm_gbps=1600)


def test_waits_are_dilated_and_the_backward_recomputes():
    clock = DeviceClock(dilation=10, scale=0.01, forward_s={"embedding": 1e-4, "layer": 0.05, "head": 0.02})
    assert clock.forward_wait("layer") == pytest.approx(0.5)
    assert clock.backward_wait("layer") == pytest.approx(1.0)
    again = DeviceClock(10, 0.01, clock.forward_s, recompute=True)
    assert again.backward_wait("layer") == pytest.approx(1.5)
    assert again.backward_wait("head") == pytest.approx(0.4)  # only layers are checkpointed
    # 2 micro-batches of embedding, 3 layers, head: forward + backward of each
    assert clock.step_wait(3, 2) == pytest.approx(2 * 10 * 3 * (1e-4 + 3 * 0.05 + 0.02))
    # a bench element stands for 1/k target elements: 1e6 bench elements are 1e8 target elements
    assert clock.optimizer_wait(10**6) == pytest.approx(10 * 1e8 * optimizer_bytes(4, 2) / 1.6e12)
    assert clock.memory_wait(1e6) == pytest.approx(10 * 1e8 / 1.6e12)


def test_the_dilation_keeps_the_arithmetic_a_small_share():
    assert dilation(2.0, 0.5, share=0.1) == pytest.approx(40.0)
    assert arithmetic_fraction(2.0, 40.0 * 0.5) == pytest.approx(0.1)
    assert dilation(0.001, 10.0) == 1.0  # never faster than the device
    with pytest.raises(ValueError, match="device_s"):
        dilation(1.0, 0.0)


def test_the_target_keeps_the_emulated_tree_with_frontiers_per_device_figures():
    emulated, frontier = load_topology("emulated-frontier"), load_topology("frontier")
    target = target_topology(emulated, frontier, nodes=8)
    assert target.nodes == 8 and target.world_size == 32
    assert [(t.name, t.fanout) for t in target.tiers] == [(t.name, t.fanout) for t in emulated.tiers]
    by = {t.name: t for t in target.tiers}
    assert by["package"].bandwidth_gbps == 200 and by["node"].bandwidth_gbps == 50
    # each GCD keeps its share of a node's injection: 100 GB/s over 8 GCDs, 4 GCDs per emulated node
    assert target.network.injection_gbps == pytest.approx(12.5 * 4)
    assert target.device.peak_tflops == 191.5


def test_links_carry_a_bench_message_in_d_times_the_targets_time():
    emulated, frontier = load_topology("emulated-frontier"), load_topology("frontier")
    target = target_topology(emulated, frontier, nodes=2)
    k, D = 1e-3, 50.0
    rates = link_rates_mbit(target, k, D)
    assert rates == pytest.approx(
        {"package": 200 * 8000 * k / D, "node": 50 * 8000 * k / D, "network": 12.5 * 8000 * k / D}
    )
    # a target message of 1 GB over the network: 80 ms on Frontier; the bench's k GB at the shaped rate: D x
    bench_s = 1e9 * k * 8 / (rates["network"] * 1e6)
    assert bench_s == pytest.approx(D * 1e9 / 12.5e9)
    assert link_delays_ms(target, D) == pytest.approx({"package": 0.1, "node": 0.2, "network": 0.5})


def test_the_cost_model_prices_the_bench_at_the_clocks_time():
    emulated, frontier = load_topology("emulated-frontier"), load_topology("frontier")
    target = target_topology(emulated, frontier, nodes=4)
    clock = DeviceClock(20.0, 2e-3, {"embedding": 0.0, "layer": 0.05, "head": 0.01})
    flops = 3e9
    priced = emulated_device(target, clock, flops, layers=1, micro_batches=2)
    assert flops / (priced.device.peak_tflops * 1e12) == pytest.approx(clock.step_wait(1, 2))
    assert priced.device.memory_bandwidth_gbps == pytest.approx(1600 * 2e-3 / 20)
    assert priced.network.injection_gbps == pytest.approx(target.network.injection_gbps * 2e-3 / 20)
    assert priced.tiers[0].latency_us == pytest.approx(target.tiers[0].latency_us * 20)
    assert priced.device.quant_gbps == 0
    # the quantizer priced as the clock waits it: a bf16 int8 gather of n values over 2 ranks quantizes
    # n/2 values (2 bytes in, a code and a scale share out) and dequantizes n (the reverse)
    from zerotopo.cost.time import quantizer_time
    from zerotopo.placement.schedule import Collective

    n = 1 << 20
    g = Collective("forward", "all_gather_int8", "params", 2, "package", 1, 1, "int8", quant_numel=n + n // 2,
                   value_bytes=2)  # fmt: skip
    moved = (n // 2) * (2 + 1 + 4 / 256) + n * (1 + 4 / 256 + 2)
    assert quantizer_time(g, priced) == pytest.approx(clock.memory_wait(moved))
