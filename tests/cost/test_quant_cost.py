"""The cost model charges the block quantizer: each int8/int4 collective's passes at the device's rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerotopo.cost.comm import comm_per_step
from zerotopo.cost.time import collective_time, quantizer_time
from zerotopo.placement.layout import padded_numel
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology

UNITS = [4096, 65536, 65536, 4096]


def _by_op(costs):
    return {(c.op, c.group): c for c in costs}


def test_quantized_collectives_carry_the_quantizers_passes():
    topo = load_topology("emulated")
    plan = get_preset("zerotopo")
    d = plan.degrees(topo)
    costs = _by_op(comm_per_step(UNITS, topo, plan, micro_batches=1))
    n = padded_numel(65536, d)
    gather = costs.get(("all_gather_int8", "secondary"))
    fwd = next(c for (op, g), c in costs.items() if op == "all_gather_int8" and g == "params")
    # a quantized gather quantizes the rank's shard and dequantizes the gathered unit
    assert fwd.quant_numel in (n + n // d.params, padded_numel(4096, d) + padded_numel(4096, d) // d.params)
    red = [c for c in costs.values() if c.op == "reduce_scatter_int4"]
    assert red and all(c.quant_numel > 0 and c.quant_numel % 2 == 0 for c in red)  # quantize + dequantize
    plain = [c for c in costs.values() if c.dtype not in ("int8", "int4")]
    assert plain and all(c.quant_numel == 0 for c in plain)
    assert gather is None or gather.quant_numel > 0


def test_quantizer_time_is_charged_at_the_devices_rate_and_only_when_known():
    topo = load_topology("emulated")
    assert topo.device.quant_gbps > 0
    costs = comm_per_step(UNITS, topo, get_preset("zerotopo"), micro_batches=1)
    q = next(c for c in costs if c.op == "all_gather_int8")
    assert quantizer_time(q, topo) == pytest.approx(q.quant_numel * 4 / (topo.device.quant_gbps * 1e9))
    unknown = replace(topo, device=replace(topo.device, quant_gbps=0.0))
    assert quantizer_time(q, unknown) == 0.0
    assert collective_time(q, topo) == pytest.approx(collective_time(q, unknown) + quantizer_time(q, topo))
    # halving the rate doubles the charge; plain collectives never pay it
    slow = replace(topo, device=replace(topo.device, quant_gbps=topo.device.quant_gbps / 2))
    assert quantizer_time(q, slow) == pytest.approx(2 * quantizer_time(q, topo))
    plain = next(c for c in costs if c.dtype not in ("int8", "int4"))
    assert quantizer_time(plain, topo) == 0.0


def test_quant_gbps_is_validated_in_topology_files(tmp_path):
    from zerotopo.errors import ConfigError
    from zerotopo.placement.topology import topology_from_mapping

    raw = {
        "name": "t",
        "device": {"name": "d", "memory_gib": 1, "peak_tflops": 1, "quant_gbps": -1},
        "tiers": [{"name": "node", "fanout": 2, "bandwidth_gbps": 1, "latency_us": 1}],
        "network": {"name": "network", "injection_gbps": 1, "latency_us": 1},
    }
    with pytest.raises(ConfigError, match="quant_gbps"):
        topology_from_mapping(raw)
    raw["device"]["quant_gbps"] = 2.5
    assert topology_from_mapping(raw).device.quant_gbps == 2.5
    del raw["device"]["quant_gbps"]
    assert topology_from_mapping(raw).device.quant_gbps == 0.0


def test_quantized_plans_carry_the_quantizers_wire_buffers():
    from zerotopo.cost.memory import memory_per_device
    from zerotopo.placement import volume

    topo = load_topology("emulated")
    plan = get_preset("zerotopo")  # int8 weights, int8 secondary, int4 gradients
    plain = replace(plan, quantize_weights=False, quantize_grads=False, secondary_dtype="bf16")
    d = plan.degrees(topo)
    largest = max(padded_numel(n, d) for n in UNITS)
    q = memory_per_device(UNITS, topo, plan)
    p = memory_per_device(UNITS, topo, plain)
    want = volume.int8_payload(largest, plan.quant_block) + 2 * volume.int4_payload(largest, plan.quant_block)
    assert q.buffers - p.buffers == want
