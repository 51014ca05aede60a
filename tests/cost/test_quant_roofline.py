"""The GPU topologies price the block quantizer by a roofline: the Triton kernels' bytes moved at the
device's memory bandwidth (``device.memory_bandwidth_gbps``); a measured ``quant_gbps`` overrides it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerotopo.cost.comm import comm_per_step
from zerotopo.cost.time import quantizer_bytes, quantizer_time
from zerotopo.errors import ConfigError
from zerotopo.placement import volume
from zerotopo.placement.plan import get_preset
from zerotopo.placement.schedule import Collective
from zerotopo.placement.topology import load_topology, topology_from_mapping

GPU_TOPOLOGIES = {"frontier": 1600, "dgx-a100": 2039, "dgx-h100": 3350, "dgx-h200": 4800, "a800": 2039}
UNITS = [4096, 1 << 20, 1 << 20, 4096]


def _gather(n: int, d: int, block: int = 256) -> Collective:
    return Collective("forward", "all_gather_int8", "params", d, "package", 1, 1, "int8",
                      message_bytes=volume.int8_payload(n, block), quant_numel=n + n // d)  # fmt: skip


def _reduce(n: int, d: int, block: int = 256) -> Collective:
    return Collective("grad_reduce", "reduce_scatter_int4", "grads", d, "node", 1, 1, "int4",
                      message_bytes=volume.int4_payload(n, block), quant_numel=2 * n)  # fmt: skip


@pytest.mark.parametrize("name", sorted(GPU_TOPOLOGIES))
def test_gpu_topologies_carry_their_memory_bandwidth_and_no_assumed_rate(name: str) -> None:
    dev = load_topology(name).device
    assert dev.memory_bandwidth_gbps == GPU_TOPOLOGIES[name]
    assert dev.quant_gbps == 0  # the assumed rates are gone: the roofline prices the kernels


def test_the_kernels_bytes_moved() -> None:
    n, d = 1 << 20, 2
    p8, p4 = volume.int8_payload(n, 256), volume.int4_payload(n, 256)
    # int8 gather: quantize this rank's n/d fp32 values into its share of the payload, then read the
    # whole payload and write the n gathered values
    assert quantizer_bytes(_gather(n, d)) == (4 * n // d + p8 // d) + (p8 + 4 * n)
    # int4 reduce-scatter: quantize n values, then read every received payload and write n/d fp32 sums
    assert quantizer_bytes(_reduce(n, 8)) == (4 * n + p4) + (p4 + 4 * n // 8)
    # bf16 values move half as many bytes in and out
    assert quantizer_bytes(_gather(n, d), value_bytes=2) == (2 * n // d + p8 // d) + (p8 + 2 * n)
    # a whole-unit int8 secondary (a one-rank "gather"): quantize n and dequantize n
    assert quantizer_bytes(_gather(n, 1)) == 2 * (4 * n + p8)


def test_mi250x_quantizer_time_is_the_roofline() -> None:
    """Frontier's quantizer time: bytes moved at 1.6 TB/s per GCD, not an assumed quantizer rate."""
    topo = load_topology("frontier")
    costs = comm_per_step(UNITS, topo, get_preset("zerotopo"), micro_batches=1)
    quantized = [c for c in costs if c.quant_numel]
    assert {c.op for c in quantized} == {"all_gather_int8", "reduce_scatter_int4"}
    for c in quantized:
        assert quantizer_time(c, topo) == pytest.approx(quantizer_bytes(c) / 1.6e12)
    g = _gather(1 << 20, 2)
    # int8 gather of 1 Mi fp32 values over a package (blocks of 256): quantize 512 Ki values (2 MiB in,
    # 520 KiB of codes and scales out), dequantize 1 Mi (1040 KiB in, 4 MiB out): 4.93 us at 1.6 TB/s
    # (the assumed 640 GB/s of fp32 values charged 1.5 Mi values 9.83 us)
    assert quantizer_time(g, topo) == pytest.approx((2 * 2**20 + 532480 + 1064960 + 4 * 2**20) / 1.6e12)
    slow = replace(topo, device=replace(topo.device, memory_bandwidth_gbps=800))
    assert quantizer_time(g, slow) == pytest.approx(2 * quantizer_time(g, topo))


def test_a_measured_rate_overrides_the_roofline_and_nothing_known_charges_nothing() -> None:
    topo = load_topology("frontier")
    g = _gather(1 << 20, 2)
    measured = replace(topo, device=replace(topo.device, quant_gbps=100.0))
    assert quantizer_time(g, measured) == pytest.approx(g.quant_numel * 4 / 100e9)
    unknown = replace(topo, device=replace(topo.device, memory_bandwidth_gbps=0.0))
    assert quantizer_time(g, unknown) == 0.0
    plain = replace(g, dtype="bf16", op="all_gather", quant_numel=0)
    assert quantizer_time(plain, topo) == 0.0


def test_memory_bandwidth_is_validated_in_topology_files() -> None:
    raw = {
        "name": "t",
        "device": {"name": "d", "memory_gib": 1, "peak_tflops": 1, "memory_bandwidth_gbps": -5},
        "tiers": [{"name": "node", "fanout": 2, "bandwidth_gbps": 1, "latency_us": 1}],
        "network": {"name": "network", "injection_gbps": 1, "latency_us": 1},
    }
    with pytest.raises(ConfigError, match=r"device\.memory_bandwidth_gbps.*expected a value > 0"):
        topology_from_mapping(raw)
    raw["device"]["memory_bandwidth_gbps"] = "fast"
    with pytest.raises(ConfigError, match="memory_bandwidth_gbps.*expected a number"):
        topology_from_mapping(raw)
    raw["device"]["memory_bandwidth_gbps"] = 1e9
    with pytest.raises(ConfigError, match="memory_bandwidth_gbps.*above the limit"):
        topology_from_mapping(raw)
    raw["device"]["memory_bandwidth_gbps"] = 1638.4
    assert topology_from_mapping(raw).device.memory_bandwidth_gbps == 1638.4
    del raw["device"]["memory_bandwidth_gbps"]
    assert topology_from_mapping(raw).device.memory_bandwidth_gbps == 0.0
