"""Measured bandwidth tables: the format, its errors, and how they override a topology."""

from __future__ import annotations

import json

import pytest
import yaml

from zerotopo.cost.calibration import apply_calibration, calibration_from_mapping, load_calibration
from zerotopo.errors import ConfigError
from zerotopo.placement.topology import load_topology

TABLE = {
    "topology": "frontier",
    "nodes": 2,
    "date": "2026-11-21",
    "tiers": {
        "package": {"bandwidth_gbps": 150.0, "latency_us": 3.0},
        "network": {"bandwidth_gbps": 9.0},
    },
}


def test_yaml_and_json_tables_override_the_measured_tiers_only(tmp_path):
    y, j = tmp_path / "cal.yaml", tmp_path / "cal.json"
    y.write_text(yaml.safe_dump(TABLE))
    j.write_text(json.dumps(TABLE))
    topo = load_topology("frontier", nodes=4)
    for path in (y, j):
        cal = apply_calibration(topo, load_calibration(path))
        assert cal.bandwidth_gbps("package") == 150 and cal.latency_us("package") == 3
        assert cal.bandwidth_gbps("node") == topo.bandwidth_gbps("node")  # not measured: YAML figure
        # the network figure is per device: stored as the node's injection bandwidth
        assert cal.bandwidth_gbps("network") == pytest.approx(9.0) and cal.network.injection_gbps == 72
        assert cal.latency_us("network") == topo.latency_us("network") and cal.nodes == 4


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ([1, 2], "must be a mapping"),
        ({"tiers": {}}, "missing required key 'topology'"),
        ({"topology": "frontier"}, "missing required key 'tiers'"),
        ({"topology": "frontier", "tiers": {}, "host": "x"}, "host: unknown key"),
        ({"topology": "frontier", "tiers": {"node": {"bw": 1}}}, "tiers.node.bw: unknown key"),
        ({"topology": "frontier", "tiers": {"node": {"bandwidth_gbps": 0}}}, "expected a value > 0"),
        ({"topology": "frontier", "tiers": {"node": {"latency_us": -1}}}, "expected a value >= 0"),
        ({"topology": "frontier", "tiers": {"node": {"latency_us": "fast"}}}, "expected a number"),
        ({"topology": "frontier", "tiers": {"node": 5}}, "tiers.node: expected a mapping"),
        ({"topology": "", "tiers": {"node": {"latency_us": 1}}}, "expected a topology name"),
    ],
)
def test_bad_tables_name_the_key(raw, words):
    with pytest.raises(ConfigError, match=words):
        calibration_from_mapping(raw, source="cal.yaml")


def test_tables_for_another_machine_or_tier_are_refused(tmp_path):
    topo = load_topology("frontier")
    with pytest.raises(ConfigError, match="measured on topology 'dgx-h100' but applied to 'frontier'"):
        apply_calibration(topo, calibration_from_mapping({**TABLE, "topology": "dgx-h100"}))
    with pytest.raises(ConfigError, match="unknown tier 'rack'.*package, node, network"):
        apply_calibration(
            topo, calibration_from_mapping({"topology": "frontier", "tiers": {"rack": {"latency_us": 1}}})
        )
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_calibration(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_calibration(tmp_path / "none.yaml")


def _measure(rank: int, world: int, spec) -> dict:
    from zerotopo.bench.curves import measure_rank

    return measure_rank(spec, rank)


@pytest.mark.slow
def test_measured_table_has_curves_per_span_tiers_and_overlap():
    from zerotopo.bench.curves import MeasureSpec
    from zerotopo.launch.spawn import spawn

    spec = MeasureSpec(
        topology="emulated",
        nodes=1,
        ops=("all_gather", "reduce_scatter"),
        sizes=(4096, 65536),
        iters=1,
        warmup=0,
    )
    tables = spawn(_measure, 4, args=(spec,), ranks_per_node=4, timeout_s=600)
    table = tables[0]
    # one node of 2 packages x 2 dies: shard groups of a package (2 ranks) and of the node (4, also the
    # whole job: measured once), and the group crossing exactly the node tier (one die per package)
    spans = {(c["op"], c["tier"], c["nodes"], c["ranks_per_node"]) for c in table["bandwidth"]}
    assert spans == {
        (op, tier, 1, rpn)
        for op in ("all_gather", "reduce_scatter")
        for tier, rpn in (("package", 2), ("node", 4), ("node", 2))
    }
    for c in table["bandwidth"]:
        assert c["sizes"] == [4096, 65536] and all(b > 0 for b in c["busbw_gbps"])
    assert set(table["tiers"]) == {"package", "node"}
    assert table["overlap"]["concurrent"] in (1, 2) and table["overlap"]["compute_slowdown"] >= 0
    # the file zerotopo calibrate writes is a calibration table the cost model reads
    cal = calibration_from_mapping(table)
    assert (
        cal["bandwidth"].busbw("all_gather", 65536, "package", 1, 2) == table["bandwidth"][0]["busbw_gbps"][1]
    )
    topo = apply_calibration(load_topology("emulated", nodes=1), cal)
    assert topo.latency_us("package") == table["tiers"]["package"]["latency_us"]
