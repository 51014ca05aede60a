"""The block quantizer priced by input dtype and pass: the rates ``zerotopo calibrate`` measures (its
``device.quantizer`` section) price each quantized collective's quantize and dequantize passes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from zerotopo.cost.calibration import calibrated, calibration_from_mapping
from zerotopo.cost.comm import comm_per_step
from zerotopo.cost.quantrates import pass_numels, rates_from_mapping, rates_to_mapping
from zerotopo.cost.rates import measure_quant_rates
from zerotopo.cost.time import quantizer_time
from zerotopo.errors import ConfigError
from zerotopo.placement import volume
from zerotopo.placement.plan import get_preset
from zerotopo.placement.schedule import Collective
from zerotopo.placement.topology import load_topology

RATES = {
    "fp32": {"int8": {"quantize": 2.0, "dequantize": 4.0}, "int4": {"quantize": 1.0, "dequantize": 2.0}},
    "bf16": {"int8": {"quantize": 0.5, "dequantize": 4.0}},
}
UNITS = [4096, 1 << 20, 1 << 20, 4096]


def _gather(n: int, d: int, value_bytes: int) -> Collective:
    return Collective("forward", "all_gather_int8", "params", d, "package", 1, 1, "int8",
                      message_bytes=volume.int8_payload(n, 256), quant_numel=n + n // d,
                      value_bytes=value_bytes)  # fmt: skip


def test_each_collective_quantizes_what_it_sends_and_dequantizes_what_it_receives():
    n = 1 << 20
    assert pass_numels("int8", 4, n + n // 4) == (n // 4, n)  # this rank's quarter, the gathered unit
    assert pass_numels("int8", 1, 2 * n) == (n, n)  # a whole-unit secondary: into it, out of it
    assert pass_numels("int4", 8, 2 * n) == (n, n)  # the values sent, the rows received and summed


def test_passes_are_priced_by_input_dtype_and_pass():
    topo = load_topology("frontier")
    dev = replace(topo.device, quant_rates=rates_from_mapping(RATES))
    measured = replace(topo, device=dev)
    n, d = 1 << 20, 2
    fp32, bf16 = _gather(n, d, 4), _gather(n, d, 2)
    # quantize n/d values, dequantize n, each at its own rate (G values per second)
    assert quantizer_time(fp32, measured) == pytest.approx((n / d / 2.0 + n / 4.0) / 1e9)
    assert quantizer_time(bf16, measured) == pytest.approx((n / d / 0.5 + n / 4.0) / 1e9)
    assert quantizer_time(bf16, measured) > quantizer_time(fp32, measured)
    # no bf16 int4 rates: that collective falls back to the roofline
    red = Collective("grad_reduce", "reduce_scatter_int4", "grads", 8, "node", 1, 1, "int4",
                     message_bytes=volume.int4_payload(n, 256), quant_numel=2 * n, value_bytes=2)  # fmt: skip
    assert quantizer_time(red, measured) == pytest.approx(quantizer_time(red, topo))
    assert quantizer_time(replace(red, value_bytes=4), measured) == pytest.approx((n / 1.0 + n / 2.0) / 1e9)


def test_the_schedule_carries_the_width_of_the_values_it_quantizes():
    topo = load_topology("frontier")
    plan = get_preset("zerotopo")  # int8 weights and secondary, int4 gradients
    for param_bytes, reduce_bytes in ((2, 4), (4, 4), (2, 2)):
        costs = comm_per_step(UNITS, topo, plan, micro_batches=1, param_bytes=param_bytes,
                              reduce_bytes=reduce_bytes)  # fmt: skip
        int8 = [c for c in costs if c.dtype == "int8" and c.quant_numel]
        int4 = [c for c in costs if c.dtype == "int4" and c.quant_numel]
        assert int8 and int4
        assert {c.value_bytes for c in int8} == {param_bytes}
        assert {c.value_bytes for c in int4} == {reduce_bytes}


def test_calibration_carries_the_quantizer_section(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"topology": "frontier", "device": {"quantizer": RATES}}))
    topo, _ = calibrated(load_topology("frontier", nodes=2), str(path))
    assert rates_to_mapping(topo.device.quant_rates) == RATES


@pytest.mark.parametrize(
    "quantizer, match",
    [
        ({"fp16": RATES["fp32"]}, r"device\.quantizer\.fp16"),
        ({"fp32": {"int2": {"quantize": 1.0}}}, r"device\.quantizer\.fp32\.int2"),
        ({"fp32": {"int8": {"pack": 1.0}}}, r"device\.quantizer\.fp32\.int8\.pack"),
        ({"fp32": {"int8": {"quantize": 0}}}, r"device\.quantizer\.fp32\.int8\.quantize"),
        ({"fp32": {"int8": {"quantize": "fast"}}}, r"device\.quantizer\.fp32\.int8\.quantize"),
        ([], r"device\.quantizer"),
    ],
)
def test_a_bad_quantizer_section_is_named(quantizer, match):
    with pytest.raises(ConfigError, match=match):
        calibration_from_mapping({"topology": "frontier", "device": {"quantizer": quantizer}})


def test_every_rate_is_measured_here():
    rates = measure_quant_rates(numel=1 << 12, repeats=1)
    assert set(rates) == {"fp32", "bf16"}
    for codes in rates.values():
        assert set(codes) == {"int8", "int4"}
        for passes in codes.values():
            assert set(passes) == {"quantize", "dequantize"} and min(passes.values()) > 0
    rates_from_mapping(rates)  # what calibrate writes, the table reads
