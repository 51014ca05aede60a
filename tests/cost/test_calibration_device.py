"""The ``device:`` section of a calibration table: this machine's measured compute and quantizer rates,
read by ``zerotopo plan --calibration FILE`` in place of peak × efficiency and the topology's rate."""

from __future__ import annotations

import pytest
import yaml

from zerotopo.cli.main import main
from zerotopo.cost.calibration import calibrated, calibration_from_mapping
from zerotopo.cost.planner import CostOptions
from zerotopo.cost.rates import measure_compute_tflops, measure_quant_gbps
from zerotopo.errors import ConfigError
from zerotopo.placement.topology import load_topology


def _write(tmp_path, device) -> str:
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"topology": "frontier", "device": device}))
    return str(path)


def test_device_rates_replace_the_efficiency_and_the_quantizer_rate(tmp_path):
    topo, measured = calibrated(
        load_topology("frontier", nodes=2), _write(tmp_path, {"compute_tflops": 80.0, "quant_gbps": 300.0})
    )
    assert topo.device.quant_gbps == 300.0 and measured["achieved_tflops"] == 80.0
    assert CostOptions(**measured).achieved_tflops == 80.0
    # without the section the topology keeps its own figures and the efficiency stays in charge
    topo, measured = calibrated(load_topology("frontier", nodes=2), _write(tmp_path, {"quant_gbps": 1.0}))
    assert topo.device.quant_gbps == 1.0 and "achieved_tflops" not in measured


def test_plan_reads_the_measured_compute_rate(tmp_path, capsys):
    cal = _write(tmp_path, {"compute_tflops": 95.75})  # half the GCD's 191.5 peak
    argv = [
        "plan",
        "--topology",
        "frontier",
        "--nodes",
        "2",
        "--model",
        "neox-20b",
        "--plans",
        "zero3",
        "--json",
    ]
    assert main([*argv, "--calibration", cal]) == 0
    measured = yaml.safe_load(capsys.readouterr().out)[0]
    assert main([*argv, "--efficiency", "0.5", "--calibration", _write(tmp_path, {"quant_gbps": 1e3})]) == 0
    at_half = yaml.safe_load(capsys.readouterr().out)[0]
    assert measured["step_time_s"] == pytest.approx(at_half["step_time_s"], rel=1e-6)


@pytest.mark.parametrize(
    "device, match",
    [({"tflops": 1.0}, "device.tflops"), ({"compute_tflops": 0}, "device.compute_tflops"), ([], "device")],
)
def test_bad_device_section_is_named(device, match):
    with pytest.raises(ConfigError, match=match):
        calibration_from_mapping({"topology": "frontier", "device": device})


def test_rates_are_measured_here():
    assert measure_compute_tflops(hidden=64, tokens=64, repeats=1) > 0
    assert measure_quant_gbps(numel=1 << 12, repeats=1) > 0
