"""``zerotopo bench scale``'s pure parts: the workload at each node count, the node list, the options of
each count and the report assembled from ``bench compare``'s (no ranks: a stand-in compare)."""

from __future__ import annotations

import json

import pytest

from zerotopo.errors import ConfigError
from zerotopo_lab.bench.clocked import target_workload, workload
from zerotopo_lab.bench.compare import CompareOptions
from zerotopo_lab.bench.scale import count_options, format_scale, parse_nodes, plot, scale, series


def test_the_global_batch_splits_over_more_ranks_as_nodes_grow():
    # NeoX-20B: micro-batch 4 on each of 384 GCDs, 1,536 sequences per step
    per_rank = {n: target_workload(n, 4).micro_batches for n in (2, 4, 8, 16)}
    assert per_rank == {2: 48, 4: 24, 8: 12, 16: 6}
    for n in (2, 4, 8, 16):
        w = target_workload(n, 4)
        assert w.ranks * w.micro_batch * w.micro_batches == w.global_batch == 1536
    assert (
        "6 micro-batches x 4 sequences per rank on 64 ranks (16 nodes): 1536"
        in target_workload(16, 4).describe()
    )


def test_the_micro_batch_mode_keeps_the_work_per_rank():
    for n in (2, 16):
        w = target_workload(n, 4, "micro-batch", micro_batches=2)
        assert w.micro_batches == 2 and w.global_batch == n * 4 * 4 * 2
    with pytest.raises(ValueError, match="does not split"):
        workload(5, 4, micro_batch=4, global_batch=1536)  # 20 ranks do not divide 384 micro-batches
    with pytest.raises(ValueError, match="unknown workload mode"):
        workload(2, 4, 4, 1536, mode="tokens")


def test_node_counts_are_parsed_and_bounded():
    assert parse_nodes("2,4,8,16") == (2, 4, 8, 16)
    assert parse_nodes("4, 2,4") == (4, 2)
    for bad in ("0", "32", "two", ","):
        with pytest.raises(ConfigError, match="--nodes"):
            parse_nodes(bad)


def test_each_count_runs_on_the_clock_with_its_workload():
    opts = count_options(CompareOptions(rows=("zero3",)), 8, "global-batch", 1)
    assert opts.regime == "device-clock" and opts.nodes == 8 and opts.micro_batches == 12
    assert opts.workload.global_batch == 1536 and opts.rows == ("zero3",)


def _fake_report(opts):
    n = opts.nodes
    rows = [
        {"name": "zero3", "step_time_s": 1.0 + n / 10, "step_time_min_s": 1.0, "step_time_max_s": 1.2 + n,
         "predicted_step_time_s": 1.1 + n / 10, "peak_memory_bytes": 2**20, "tier_bytes_per_step": {"network": 2e6}},
        {"name": "fsdp2-hsdp", "step_time_s": 2.0, "step_time_min_s": 1.9, "step_time_max_s": 2.1,
         "predicted_step_time_s": None, "peak_memory_bytes": None, "tier_bytes_per_step": {}},
        {"name": "zeropp", "does_not_fit": True, "step_time_s": None},
    ]  # fmt: skip
    clock = {"dilation": 12.5, "workload": opts.workload.describe()}
    return {"world_size": 4 * n, "device_clock": clock, "regime": {"name": "device-clock"}, "rows": rows,
            "planner_pick": "zero3", "fastest_zerotopo_row": "zero3", "losses_agree": True, "void": None}  # fmt: skip


def test_each_count_runs_with_and_without_the_curves():
    report = scale(CompareOptions(), (2,), "micro-batch", curves=(None, "frontier-48"),
                   run_compare=lambda opts: {**_fake_report(opts), "curves_seen": opts.curves})  # fmt: skip
    assert [e["curves"] for e in report["counts"]] == [None, "frontier-48"]
    assert set(series(report)) >= {"zero3", "zero3 (frontier-48)"}


def test_the_report_holds_every_count_and_plots(tmp_path):
    report = scale(CompareOptions(), (2, 4), "global-batch", run_compare=_fake_report)
    json.dumps(report)
    assert [e["nodes"] for e in report["counts"]] == [2, 4]
    assert [e["dilation"] for e in report["counts"]] == [12.5, 12.5]
    assert report["counts"][1]["workload"].startswith("24 micro-batches")
    s = series(report)
    # in the target's seconds: each count's step over its own D
    assert s["zero3"]["measured"] == [(2, pytest.approx(1.2 / 12.5)), (4, pytest.approx(1.4 / 12.5))]
    assert s["zero3"]["predicted"] == [(2, pytest.approx(1.3 / 12.5)), (4, pytest.approx(1.5 / 12.5))]
    assert s["fsdp2-hsdp"]["predicted"] == [] and "zeropp" not in s or s["zeropp"]["measured"] == []
    text = format_scale(report)
    assert "4 nodes (16 ranks), D 12.5" in text and "zeropp           does not fit" in text
    pytest.importorskip("matplotlib")
    plot(report, str(tmp_path / "scale.png"))
    assert (tmp_path / "scale.png").stat().st_size > 0
