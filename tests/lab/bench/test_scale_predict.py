"""``zerotopo bench scale --predict``: the cost model's answer at each node count, no rank started."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zerotopo_lab.bench.compare import (
    CLOCK_BATCH,
    CLOCK_SEQ,
    CompareOptions,
    model_config,
    priced,
    resolve_rows,
)
from zerotopo_lab.bench.scale import count_options, format_predicted, node_topology, predict

ROWS = ("no-comm", "planner", "zero3", "deepspeed-zero3", "fsdp2-hsdp")


def _base(tmp_path):
    base = CompareOptions(regime="device-clock", model="wide", rows=ROWS, dtype="bf16", batch=CLOCK_BATCH,
                          seq=CLOCK_SEQ)  # fmt: skip
    return replace(base, topology=node_topology(4, str(tmp_path)))


def test_predictions_are_a_runs_over_its_dilation_and_rank_the_rows(tmp_path):
    base = _base(tmp_path)
    report = predict(base, (2,), "micro-batch")
    assert report["predicted"] is True and report["nodes"] == [2]
    (entry,) = report["counts"]
    assert entry["dilation"] == 1.0 and entry["world_size"] == 8 and entry["planner_pick"]
    rows = {r["name"]: r for r in entry["rows"]}
    assert rows["planner"]["over_pick"] == 1.0
    for name in ("planner", "zero3", "deepspeed-zero3"):
        # every row communicates, so every step is longer than its units' device time
        assert rows[name]["predicted_step_time_s"] > entry["units_device_s_per_step"] > 0
        assert rows[name]["over_units"] > 1
    assert rows["deepspeed-zero3"]["over_pick"] > 1  # the pick is the model's fastest
    assert rows["fsdp2-hsdp"]["predicted_step_time_s"] is None and rows["no-comm"]["kind"] == "floor"
    # a run measures D from its arithmetic rate; its predictions are these, D times longer
    opts, _, _, _, clocked, cost_topo, measured = priced(
        count_options(base, 2, "micro-batch", 1), measure=lambda *_: 2e8
    )
    D = clocked.clock.dilation
    assert D > 10
    cfg, seq = model_config(opts)
    _, meta = resolve_rows(opts, cost_topo, cfg.shape(seq, name=opts.model), measured)
    for name in ("planner", "zero3"):
        assert meta[name]["predicted"] / D == pytest.approx(rows[name]["predicted_step_time_s"], rel=1e-9)
    # the bytes a run's links would carry per tier (a run's ring_tier_bytes), which no D changes
    for name in ("planner", "zero3", "deepspeed-zero3"):
        assert rows[name]["ring_tier_bytes"] == meta[name]["ring_tier_bytes"]
        assert rows[name]["ring_tier_bytes"]["network"] > 0
    assert "ring_tier_bytes" not in rows["fsdp2-hsdp"]
    # but DeepSpeed's host work per module (this machine's processor time, measured, not dilated): 0.4 ms
    # of a 0.56 s target step here
    ds = meta["deepspeed-zero3"]["predicted"] / D
    assert ds < rows["deepspeed-zero3"]["predicted_step_time_s"] == pytest.approx(ds, rel=1e-3)
    text = format_predicted(report)
    assert "nothing run" in text and "fsdp2-hsdp       no model (measured only)" in text


def test_the_cli_predicts_counts_beyond_the_machine(tmp_path, capsys):
    from zerotopo.cli.main import main

    out = tmp_path / "predict.json"
    argv = ["bench", "scale", "--predict", "--nodes", "32", "--mode", "micro-batch", "--curves", "off",
            "--rows", "planner,deepspeed-zero3", "--json", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert "# rank output" not in captured.err  # no rank starts, so no rank log is named
    assert printed == json.loads(out.read_text())
    (entry,) = printed["counts"]
    assert entry["nodes"] == 32 and entry["world_size"] == 128
    assert [r["name"] for r in entry["rows"]] == ["planner", "deepspeed-zero3"]
    # without --predict, 32 nodes of 4 are more ranks than one machine holds
    assert main(argv[:2] + argv[3:]) != 0
    assert "expected node counts from 1 to 16, got '32'" in capsys.readouterr().err


def test_predict_reports_merge_with_their_own_kind_only(tmp_path, capsys):
    from zerotopo.cli.main import main
    from zerotopo.errors import ConfigError
    from zerotopo_lab.bench.scale import merge_reports

    base = _base(tmp_path)
    paths = []
    for n in (4, 2):
        path = tmp_path / f"predict{n}.json"
        path.write_text(json.dumps(predict(replace(base, rows=("planner", "zero3")), (n,), "micro-batch")))
        paths.append(str(path))
    merged = merge_reports(paths)
    assert merged["predicted"] is True and merged["nodes"] == [2, 4]
    assert main(["bench", "scale", "--from", ",".join(paths)]) == 0
    out = capsys.readouterr().out
    assert "nothing run" in out and "4 nodes (16 ranks)" in out
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"command": "", "mode": "micro-batch", "nodes": [8], "counts": [{"nodes": 8}]}))
    with pytest.raises(ConfigError, match="mix runs and --predict reports"):
        merge_reports([paths[0], str(run)])
