"""Bandwidth curves: interpolation in log message size, across node counts at the same per-rank chunk,
fewer ranks per node, fallbacks, the shipped Frontier table and the calibration file's sections."""

from __future__ import annotations

import math

import pytest
import yaml

from zerotopo.cost.bandwidth import BandwidthTable, Curve, curves_from_list, default_table
from zerotopo.cost.calibration import calibration_from_mapping, load_calibration
from zerotopo.cost.time import OverlapModel, collective_time
from zerotopo.errors import ConfigError
from zerotopo.placement.schedule import Collective
from zerotopo.placement.topology import load_topology

M = 1 << 20


def _curve(nodes, bws, op="all_gather", rpn=8, tier="network"):
    return Curve(op, tier, nodes, rpn, (M, 4 * M, 16 * M), tuple(bws))


def test_curve_is_linear_in_log_size_and_clamped():
    c = _curve(2, [1.0, 3.0, 9.0])
    assert c.at(M) == 1.0 and c.at(4 * M) == 3.0 and c.at(16 * M) == 9.0
    assert c.at(2 * M) == pytest.approx(2.0)  # halfway in log size between 1M and 4M
    assert c.at(8 * M) == pytest.approx(6.0)
    assert c.at(1) == 1.0 and c.at(1 << 40) == 9.0


def test_node_counts_between_curves_read_the_same_chunk_and_interpolate_in_log_nodes():
    t = BandwidthTable("x", (_curve(2, [1.0, 3.0, 9.0]), _curve(8, [2.0, 4.0, 10.0])))
    assert t.busbw("all_gather", 4 * M, "network", 2, 8) == 3.0  # a measured count: its curve
    # 4 nodes: the 2-node curve at half the message (same per-rank chunk), the 8-node one at twice it
    lo, hi = _curve(2, [1.0, 3.0, 9.0]).at(2 * M), _curve(8, [2.0, 4.0, 10.0]).at(8 * M)
    f = math.log(4 / 2) / math.log(8 / 2)
    assert t.busbw("all_gather", 4 * M, "network", 4, 8) == pytest.approx(lo + f * (hi - lo))
    # beyond the measured counts: the nearest curve at the same chunk
    assert t.busbw("all_gather", 16 * M, "network", 16, 8) == pytest.approx(_curve(8, [2, 4, 10]).at(8 * M))
    # the int8 all-gather is an all-gather; another tier or op family has no curve
    assert t.busbw("all_gather_int8", 4 * M, "network", 2, 8) == 3.0
    assert t.busbw("all_gather", 4 * M, "node", 1, 8) is None


def test_fewer_ranks_per_node_share_the_nics_and_fallback_families():
    t = BandwidthTable("x", (_curve(2, [1.0, 3.0, 9.0], op="reduce_scatter"),))
    # one rank per node: eight groups share the node's NICs; the curve is read at the same chunk per
    # node crossing (8x the message) and divided by 8
    assert t.busbw("reduce_scatter", M / 2, "network", 2, 1) == pytest.approx(3.0 / 8)
    # all-reduce and the int4 all-to-all without curves of their own use the reduce-scatter's
    assert t.busbw("all_reduce", 4 * M, "network", 2, 8) == 3.0
    assert t.busbw("reduce_scatter_int4", 4 * M, "network", 2, 8) == 3.0
    assert t.busbw("all_gather", 4 * M, "network", 2, 8) is None


def test_collective_time_uses_the_table_then_alpha_beta():
    topo = load_topology("frontier", nodes=2)
    t = BandwidthTable("frontier", (_curve(2, [1.0, 3.0, 9.0]),))
    c = Collective(
        "forward", "all_gather", "params", 16, "network", 15 * M // 4, 1, "bf16", 4 * M, True, 2, 8
    )
    assert collective_time(c, topo, t) == pytest.approx(c.bytes_sent / 3e9)
    # no curve for the node tier: alpha-beta on the topology's figures
    n = Collective("backward", "all_gather", "secondary", 8, "node", 7 * M, 1, "bf16", 8 * M, True, 1, 8)
    assert collective_time(n, topo, t) == pytest.approx(7 * 4e-6 + 7 * M / 50e9)


def test_frontier_table_is_the_published_measurements():
    t = default_table("frontier")
    assert t is not None and len(t.curves) == 16
    by = {(c.op, c.nodes): c for c in t.curves}
    # spot checks against axonn-ai/sc2025-pccl-reproducer data/frontier/*_2/slurm-*.out (nccl rows)
    assert by[("all_gather", 2)].at(256 * M) == pytest.approx(71.199)
    assert by[("all_gather", 1)].tier == "node" and by[("all_gather", 1)].at(128 * M) == pytest.approx(88.968)
    assert by[("reduce_scatter", 64)].at(1024 * M) == pytest.approx(46.383)
    # the slow band: a 16 MiB all-gather over 8 nodes runs at under 1 GB/s, 256 MiB at over 70
    assert by[("all_gather", 8)].at(16 * M) < 1 and by[("all_gather", 8)].at(256 * M) > 70
    assert default_table("emulated") is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ([{"op": "bcast"}], "missing required key"),
        ([{"op": "gather", "tier": "n", "nodes": 1, "ranks_per_node": 1, "sizes": [1], "busbw_gbps": [1]}], "unknown op"),
        ([{"op": "all_gather", "tier": "n", "nodes": 0, "ranks_per_node": 1, "sizes": [1], "busbw_gbps": [1]}], "positive integer"),
        ([{"op": "all_gather", "tier": "n", "nodes": 1, "ranks_per_node": 1, "sizes": [2, 1], "busbw_gbps": [1, 1]}], "increase"),
        ([{"op": "all_gather", "tier": "n", "nodes": 1, "ranks_per_node": 1, "sizes": [1], "busbw_gbps": [0]}], "bandwidth > 0"),
        ([{"op": "all_gather", "tier": "n", "nodes": 1, "ranks_per_node": 1, "sizes": [1, 2], "busbw_gbps": [1]}], "same length"),
        ([{"op": "all_gather", "tier": "n", "nodes": 1, "ranks_per_node": 1, "sizes": ["x"], "busbw_gbps": [1]}], "size in bytes"),
    ],
)  # fmt: skip
def test_bad_curves_name_the_key(raw, words):
    with pytest.raises(ConfigError, match=words):
        curves_from_list(raw, "t.yaml")


def test_calibration_file_carries_curves_and_overlap(tmp_path):
    raw = {
        "topology": "frontier",
        "bandwidth": [
            {"op": "all_gather", "tier": "node", "nodes": 1, "ranks_per_node": 8, "sizes": ["1M", "64M"],
             "busbw_gbps": [5.0, 80.0]}
        ],
        "overlap": {"compute_slowdown": 0.1, "concurrent": 1},
    }  # fmt: skip
    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump(raw))
    cal = load_calibration(p)
    assert cal["bandwidth"].busbw("all_gather", 64 * M, "node", 1, 8) == 80.0
    assert cal["overlap"] == OverlapModel(compute_slowdown=0.1, concurrent=1)
    with pytest.raises(ConfigError, match="overlap.stall: unknown key"):
        calibration_from_mapping({"topology": "frontier", "overlap": {"stall": 1}})
    with pytest.raises(ConfigError, match="concurrent must be"):
        calibration_from_mapping({"topology": "frontier", "overlap": {"concurrent": 0}})
