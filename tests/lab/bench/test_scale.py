"""``zerotopo bench scale``'s pure parts: the workload at each node count, the node list, the options of
each count and the report assembled from ``bench compare``'s (no ranks: a stand-in compare)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerotopo.errors import ConfigError
from zerotopo_lab.bench.clocked import target_workload, workload
from zerotopo_lab.bench.compare import CompareOptions
from zerotopo_lab.bench.scale import (
    count_options,
    format_scale,
    merge_reports,
    parse_nodes,
    plot,
    scale,
    series,
)


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


def test_a_count_states_the_deepspeed_buckets_it_ran():
    buckets = {"prefetch": 195829, "reduce": 1958290, "persistence": 392}
    report = scale(CompareOptions(), (2,), "micro-batch",
                   run_compare=lambda opts: {**_fake_report(opts), "deepspeed_buckets": buckets})  # fmt: skip
    assert report["counts"][0]["deepspeed_buckets"] == buckets
    assert f"DeepSpeed buckets {buckets}" in format_scale(report)
    plain = scale(CompareOptions(), (2,), "micro-batch", run_compare=_fake_report)
    assert plain["counts"][0]["deepspeed_buckets"] is None and "buckets" not in format_scale(plain)


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
    # the repeats' min-max, over the same D, drawn as a bar at each count
    assert s["zero3"]["spread"] == [(2, pytest.approx(1.0 / 12.5), pytest.approx(3.2 / 12.5)),
                                    (4, pytest.approx(1.0 / 12.5), pytest.approx(5.2 / 12.5))]  # fmt: skip
    text = format_scale(report)
    assert "4 nodes (16 ranks), D 12.5" in text and "zeropp           does not fit" in text
    pytest.importorskip("matplotlib")
    plot(report, str(tmp_path / "scale.png"))
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_the_counts_done_are_kept_when_a_later_one_fails(tmp_path):
    out = tmp_path / "scale.json"

    def compare_until_8(opts):
        if opts.nodes == 8:
            raise RuntimeError("rank 17 ran out of memory")
        return _fake_report(opts)

    with pytest.raises(RuntimeError, match="out of memory"):
        scale(CompareOptions(), (2, 4, 8), "micro-batch", run_compare=compare_until_8, partial=str(out))
    kept = json.loads(out.read_text())
    assert kept["nodes"] == [2, 4] and [e["nodes"] for e in kept["counts"]] == [2, 4]
    assert merge_reports([str(out)])["nodes"] == [2, 4]


def test_reports_of_separate_runs_merge_into_one(tmp_path, capsys):
    from zerotopo.cli.main import main

    paths = []
    for nodes in ((8,), (2, 4)):  # one run per allocation, in any order
        path = tmp_path / f"scale{nodes[0]}.json"
        report = scale(
            CompareOptions(), nodes, "micro-batch", command=f"run {nodes}", run_compare=_fake_report
        )
        path.write_text(json.dumps(report))
        paths.append(str(path))
    merged = merge_reports(paths)
    assert merged["nodes"] == [2, 4, 8] and [e["nodes"] for e in merged["counts"]] == [2, 4, 8]
    assert merged["mode"] == "micro-batch" and merged["command"] == "run (8,); run (2, 4)"
    assert [n for n, _ in series(merged)["zero3"]["measured"]] == [2, 4, 8]
    assert main(["bench", "scale", "--from", ",".join(paths)]) == 0
    assert "8 nodes (32 ranks), D 12.5" in capsys.readouterr().out
    # one file twice, mixed modes, and a file that is not a report are refused by name
    with pytest.raises(ConfigError, match="scale8.json is given twice"):
        merge_reports([paths[0], paths[0]])
    other = tmp_path / "global.json"
    other.write_text(json.dumps(scale(CompareOptions(), (16,), "global-batch", run_compare=_fake_report)))
    with pytest.raises(ConfigError, match="mix modes"):
        merge_reports([paths[0], str(other)])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="not a `bench scale` JSON report"):
        merge_reports([str(bad)])


def _repeat_run(tmp_path, name, floor, zero3, D=60.8, loss=7.9, command="run"):
    """A one-count report as a run of ``len(floor)`` repeats writes it (``floor``/``zero3``: each repeat's
    step), with zerotopo 10% faster than zero3 and the pick a copy of the floor's times plus 1%."""

    def row(name, kind, repeats, pred=None, **extra):
        step = sorted(repeats)[len(repeats) // 2]
        return {"name": name, "kind": kind, "plan": name, "step_time_s": step, "repeat_step_times_s": repeats,
                "step_time_min_s": min(repeats), "step_time_max_s": max(repeats), "tokens_per_s": 1000 / step,
                "predicted_step_time_s": pred, "quantized": False, "final_loss": None if kind == "floor" else loss,
                "peak_memory_bytes": max(extra.get("peaks", [1])), "peak_memory_bytes_per_rank": extra.get("peaks", [1]),
                "tier_bytes_per_step": {"network": extra.get("net", 0.0)},
                "tier_payload_bytes_per_step": {"network": extra.get("net", 0.0)},
                "ring_tier_bytes": {"node": 1.0, "network": 100.0}, "cpu_s_per_step": extra.get("cpu", 1.0)}  # fmt: skip

    rows = [row("no-comm", "floor", floor), row("zero3", "zerotopo", zero3, pred=330.0, net=104.0, peaks=[5, 9]),
            row("zerotopo", "zerotopo", [z * 0.9 for z in zero3], pred=300.0, net=101.0, peaks=[7, 3], cpu=3.0)]  # fmt: skip
    entry = {"nodes": 8, "curves": None, "topology": "emulated-frontier", "world_size": 32, "ranks_per_node": 4,
             "dilation": D, "workload": "12 micro-batches", "device_clock": {"dilation": D, "flops_per_rank": 7e8},
             "planner_pick": "zero1", "fastest_zerotopo_row": "zerotopo", "losses_agree": True, "void": None,
             "regime": {"name": "device-clock", "measured_R": 0.0, "measured_R_repeats": []},
             "deepspeed_buckets": None, "wall_s": 5000.0 * len(floor), "rows": rows}  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps({"command": command, "mode": "global-batch", "nodes": [8], "counts": [entry]}))
    return str(path)


def test_runs_of_one_count_at_one_dilation_pool_their_repeats(tmp_path, capsys):
    from zerotopo.cli.main import main

    one = _repeat_run(tmp_path, "a.json", [300.0], [400.0], command="first")
    two = _repeat_run(tmp_path, "b.json", [302.0, 298.0], [410.0, 390.0], command="second")
    merged = merge_reports([one, two])
    assert merged["nodes"] == [8] and len(merged["counts"]) == 1 and merged["command"] == "first; second"
    e = merged["counts"][0]
    rows = {r["name"]: r for r in e["rows"]}
    z3 = rows["zero3"]
    # as one run of three repeats: the median of all repeats, their min and max, throughput and prediction
    assert z3["repeat_step_times_s"] == [400.0, 410.0, 390.0] and z3["step_time_s"] == 400.0
    assert (z3["step_time_min_s"], z3["step_time_max_s"]) == (390.0, 410.0)
    assert z3["tokens_per_s"] == pytest.approx(1000 / 400)
    assert z3["predicted_over_measured"] == pytest.approx(330 / 400)
    zt = rows["zerotopo"]
    assert zt["step_time_s"] == pytest.approx(360.0)
    assert zt["cpu_s_per_step"] == 3.0 and zt["peak_memory_bytes_per_rank"] == [7, 3]
    assert z3["network_bytes_over_ring"] == pytest.approx(1.04)
    # the measured R from each repeat's own pair, its median the count's
    assert e["regime"]["measured_R_repeats"] == pytest.approx([1 / 3, 410 / 302 - 1, 390 / 298 - 1])
    assert e["regime"]["measured_R"] == pytest.approx(1 / 3)
    assert e["fastest_zerotopo_row"] == "zerotopo" and e["losses_agree"] and e["wall_s"] == 15000.0
    assert [(p["command"], p["repeats"]) for p in e["pooled_from"]] == [("first", 1), ("second", 2)]
    assert main(["bench", "scale", "--from", f"{one},{two}"]) == 0
    out = capsys.readouterr().out
    assert "zero3             400.000 390.000-410.000  330.000" in out
    assert "8 nodes (32 ranks), D 60.8, the repeats of 2 runs pooled: 12 micro-batches" in out


def test_a_pooled_row_counts_its_schedules_messages_from_the_run_that_counted_them(tmp_path):
    # a report from before the messages were counted pooled with one after: the schedule is the count's,
    # so the pooled row divides its payload beyond the ring's bytes by the later run's messages
    old = _repeat_run(tmp_path, "old.json", [300.0], [400.0])
    new = json.loads(Path(_repeat_run(tmp_path, "new.json", [302.0], [410.0])).read_text())
    for r in new["counts"][0]["rows"]:
        r["ring_tier_messages"] = {"node": 1.0, "network": 2.0}
    (tmp_path / "new.json").write_text(json.dumps(new))
    rows = {r["name"]: r for r in merge_reports([old, str(tmp_path / "new.json")])["counts"][0]["rows"]}
    assert rows["zero3"]["ring_tier_messages"] == {"node": 1.0, "network": 2.0}
    assert rows["zero3"]["network_excess_bytes_per_message"] == pytest.approx((104.0 - 100.0) / 2)
    older = _repeat_run(tmp_path, "older.json", [301.0], [405.0])
    only_old = {r["name"]: r for r in merge_reports([old, older])["counts"][0]["rows"]}
    assert "network_excess_bytes_per_message" not in only_old["zero3"]


def test_runs_that_are_not_one_quantity_are_not_pooled(tmp_path, capsys):
    from zerotopo.cli.main import main

    one = _repeat_run(tmp_path, "a.json", [300.0], [400.0])
    other_d = _repeat_run(tmp_path, "b.json", [200.0], [260.0], D=40.1)
    with pytest.raises(
        ConfigError, match=r"b.json ran 8 nodes at D 40.1 and .*a.json at D 60.8.*--dilation 60.8 "
    ):
        merge_reports([one, other_d])
    # a row's runs compute the same steps: losses that differ void the pooled count
    drifted = _repeat_run(tmp_path, "c.json", [301.0], [401.0], loss=8.5)
    e = merge_reports([one, drifted])["counts"][0]
    assert not e["losses_agree"] and "zero3's final losses differ between the runs pooled" in e["void"]
    assert main(["bench", "scale", "--from", f"{one},{drifted}"]) == 1
    capsys.readouterr()
    picked = json.loads(Path(one).read_text())
    picked["counts"][0]["planner_pick"] = "zero3"
    (tmp_path / "e.json").write_text(json.dumps(picked))
    with pytest.raises(ConfigError, match="different planner_pick"):
        merge_reports([one, str(tmp_path / "e.json")])


def test_rows_run_apart_at_one_dilation_join_into_one_table(tmp_path):
    one = _repeat_run(tmp_path, "a.json", [300.0], [400.0], command="first")
    # a later run of other rows at the same D, beside the floor, no planner row asked
    later = json.loads(
        Path(_repeat_run(tmp_path, "b.json", [302.0, 304.0], [999.0], command="second")).read_text()
    )
    entry = later["counts"][0]
    entry["planner_pick"] = None
    floor, zero3, _ = entry["rows"]
    entry["rows"] = [floor, {**zero3, "name": "mics", "plan": "mics", "predicted_step_time_s": 420.0}]
    (tmp_path / "b.json").write_text(json.dumps(later))
    e = merge_reports([one, str(tmp_path / "b.json")])["counts"][0]
    rows = {r["name"]: r for r in e["rows"]}
    assert [r["name"] for r in e["rows"]] == ["no-comm", "zero3", "mics", "zerotopo"]  # a whole run's order
    # each row pools the runs that ran it: the floor both, zero3 and zerotopo the first, mics the second
    assert (
        rows["no-comm"]["repeat_step_times_s"] == [300.0, 302.0, 304.0]
        and rows["no-comm"]["step_time_s"] == 302.0
    )
    assert rows["zero3"]["repeat_step_times_s"] == [400.0] and rows["mics"]["repeat_step_times_s"] == [999.0]
    assert rows["mics"]["predicted_over_measured"] == pytest.approx(420 / 999)
    # the measured R from the run that ran both zero3 and the floor; the pick from the run that asked
    assert e["regime"]["measured_R_repeats"] == pytest.approx([1 / 3]) and e["planner_pick"] == "zero1"
    assert [p["rows"] for p in e["pooled_from"]] == [["no-comm", "zero3", "zerotopo"], ["no-comm", "mics"]]
    assert e["losses_agree"] and e["fastest_zerotopo_row"] == "zerotopo"
    text = format_scale({"mode": "global-batch", "nodes": [8], "counts": [e]})
    assert "mics              999.000" in text and "the repeats of 2 runs pooled" in text


def test_eight_ranks_a_node_are_four_packages_of_frontiers_share(tmp_path):
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.clock import target_topology
    from zerotopo_lab.bench.scale import node_topology

    assert node_topology(4, str(tmp_path)) == "emulated-frontier"
    four = load_topology("emulated-frontier", nodes=2)
    eight = load_topology(node_topology(8, str(tmp_path)), nodes=2)
    assert eight.devices_per_node == 8 and eight.world_size == 16
    assert [(t.name, t.fanout) for t in eight.tiers] == [("package", 2), ("node", 4)]
    # each rank keeps its share of the node's injection
    assert eight.network.injection_gbps == pytest.approx(2 * four.network.injection_gbps)
    # ranks 0-7 on node 0, 8-15 on node 1
    assert eight.tier_of_group((6, 7)) == "package" and eight.tier_of_group((3, 4)) == "node"
    assert eight.tier_of_group((7, 8)) == "network" and eight.tier_of_group((0, 15)) == "network"
    # the clock's target: Frontier's node of 8 GCDs sharing its 100 GB/s
    target = target_topology(eight, load_topology("frontier"), 2)
    assert target.devices_per_node == 8 and target.network.injection_gbps == pytest.approx(100.0)
    with pytest.raises(ConfigError, match="--ranks-per-node"):
        node_topology(5, str(tmp_path))


def test_eight_ranks_a_node_split_the_global_batch_and_replay_a_whole_node(tmp_path):
    from zerotopo_lab.bench.replay import target_span
    from zerotopo_lab.bench.scale import node_topology

    opts = count_options(CompareOptions(topology=node_topology(8, str(tmp_path))), 2, "global-batch", 1)
    assert opts.micro_batches == 24 and opts.workload.ranks == 16  # 1536 / (4 x 16)
    # a bench node of 8 stands for a Frontier node of 8: no share to scale
    assert target_span(1, 8, 8, 2, 8) == ("node", 1, 8)
    assert target_span(2, 16, 8, 2, 8) == ("network", 2, 8)
    assert target_span(2, 2, 8, 2, 8) == ("network", 2, 1)
    assert target_span(1, 4, 4, 2, 8) == ("node", 1, 8)  # 4 per node: half a node's GCDs each


def test_more_ranks_than_the_machine_holds_are_refused(capsys):
    from zerotopo.cli.main import main

    assert main(["bench", "scale", "--nodes", "2,16", "--ranks-per-node", "8"]) != 0
    assert "--nodes: 16 nodes of 8 ranks are 128 ranks" in capsys.readouterr().err


@pytest.mark.slow
def test_two_nodes_of_eight_ranks_run_and_their_links_show_the_nodes(tmp_path):
    # one step of zero3 on 2 x 8 ranks: a ring over the 16 ranks crosses a package in 8 of its hops, a
    # node's packages in 6 and the network in 2 (7-8, 15-0), as the links count them
    import subprocess
    import sys

    from zerotopo.launch.netem import available

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated network unavailable: {why}")
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "-m", "zerotopo.cli.main", "bench", "scale", "--nodes", "2", "--ranks-per-node", "8",
           "--model", "tiny", "--rows", "zero3", "--mode", "micro-batch", "--curves", "off", "--steps", "1",
           "--warmup", "1", "--repeat", "1", "--timeout", "900", "--json", "-o", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1200)
    report = json.loads(out.read_text())
    (entry,) = report["counts"]
    assert entry["nodes"] == 2 and entry["ranks_per_node"] == 8 and entry["world_size"] == 16
    assert entry["topology"] == "emulated-frontier-8" and entry["dilation"] >= 1
    assert entry["workload"].startswith("1 micro-batches x 4 sequences per rank on 16 ranks (2 nodes)")
    (row,) = entry["rows"]
    assert row["name"] == "zero3" and len(row["peak_memory_bytes_per_rank"]) == 16
    sent = row["tier_payload_bytes_per_step"]
    assert sent["node"] / sent["package"] == pytest.approx(6 / 8, rel=0.05)
    assert sent["network"] / sent["package"] == pytest.approx(2 / 8, rel=0.05)


def test_the_clock_options_reach_every_count(monkeypatch, capsys):
    from zerotopo.cli.main import main
    from zerotopo_lab.bench import scale as S

    seen = []

    def fake(base, nodes, mode, micro_batches, command="", **kw):
        seen.append((base.arithmetic_share, base.target_buckets, base.dilation))
        return scale(base, nodes, mode, micro_batches, command, run_compare=_fake_report)

    monkeypatch.setattr(S, "scale", fake)
    argv = ["bench", "scale", "--nodes", "2", "--curves", "off", "--json"]
    assert main([*argv, "--arithmetic-share", "0.05", "--deepspeed-buckets", "target"]) == 0
    assert main(argv) == 0
    assert main([*argv, "--dilation", "60.80321277263183"]) == 0
    assert seen == [(0.05, True, None), (None, False, None), (None, False, 60.80321277263183)]
    capsys.readouterr()  # None: derive takes the ranks' default share and plans D from it
    for bad, why in ((["--nodes", "2,4", "--dilation", "9"], "a D belongs to one node count's run"),
                     (["--nodes", "2", "--dilation", "0.5"], "expected a dilation of at least 1, got 0.5"),
                     (["--nodes", "2", "--dilation", "9", "--arithmetic-share", "0.1"], "give one of them")):  # fmt: skip
        assert main(["bench", "scale", *bad]) != 0
        assert why in capsys.readouterr().err
    assert main(["bench", "scale", "--nodes", "2", "--arithmetic-share", "2"]) != 0
    assert "--arithmetic-share: expected a share in (0, 1], got 2.0" in capsys.readouterr().err
