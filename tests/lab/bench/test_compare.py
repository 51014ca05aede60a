"""``zerotopo bench compare`` on a tiny model: every row runs, losses agree, the JSON is complete, the
emulated links count bytes per tier, and a SIGTERM leaves no namespace or rank behind."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerotopo.cost.time import OverlapModel
from zerotopo.errors import ZerotopoError
from zerotopo.launch.netem import available
from zerotopo_lab.bench.compare import (
    DEFAULT_ROWS,
    CompareOptions,
    check_losses,
    compare,
    format_report,
    plot,
)

MINI = str(Path(__file__).with_name("mini-frontier.yaml"))
EMULATE, WHY = available()
needs_netem = pytest.mark.skipif(not EMULATE, reason=f"emulated network unavailable: {WHY}")

ROW_KEYS = {
    "name": str,
    "kind": str,
    "degrees": str,
    "step_time_s": float,
    "step_times_s": list,
    "tokens_per_s": float,
    "tier_bytes_per_step": dict,
    "peak_memory_bytes_per_rank": list,
    "cpu_s_per_step": float,
    "final_loss": float,
    "losses": list,
    "quantized": bool,
    "loss_ok": bool,
}


@pytest.fixture(scope="module")
def report():
    # one spawn for every row; on the emulated cluster where this machine allows it
    opts = CompareOptions(topology=MINI, model="tiny", steps=2, warmup=1, micro_batches=2, batch=1,
                          seq=16, emulate=EMULATE, network_mbit=100)  # fmt: skip
    return compare(opts, command="test")


@pytest.mark.slow
def test_every_row_runs_on_the_same_batch(report):
    assert [r["name"] for r in report["rows"]] == list(DEFAULT_ROWS)
    assert not [r for r in report["rows"] if r.get("error")]
    assert report["global_batch"] == 4 * 2 * 1 and report["tokens_per_step"] == 4 * 2 * 1 * 16
    for r in report["rows"]:
        assert len(r["step_times_s"]) == 2 and r["step_time_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(report["tokens_per_step"] / r["step_time_s"])
        assert len(r["losses"]) == 3  # warm-up step and 2 timed
        predicted = r["predicted_step_time_s"]
        # zerotopo rows and the DeepSpeed rows (on DeepSpeed's schedule) are predicted, FSDP2's not
        costed = r["kind"] in ("zerotopo", "deepspeed")
        assert (predicted is not None and predicted > 0) == costed, r["name"]
        assert costed or "predicted_over_measured" not in r
    assert report["planner_pick"] and report["fastest_zerotopo_row"] in DEFAULT_ROWS


@pytest.mark.slow
def test_losses_agree_across_frameworks(report):
    assert report["losses_agree"], report["void"]
    exact = [r for r in report["rows"] if not r["quantized"] and r["kind"] != "floor"]
    assert {r["kind"] for r in exact} == {"zerotopo", "deepspeed", "fsdp2"}
    ref = exact[0]["losses"]
    for r in exact:  # fp32 everywhere: the same numbers up to summation order, step after step
        assert r["losses"] == pytest.approx(ref, rel=1e-4), r["name"]
    # and the model learns: the rows compare training, not noise
    assert report["rows"][0]["losses"][0] > 0


@pytest.mark.slow
def test_json_report_schema(report, tmp_path):
    doc = json.loads(json.dumps(report))
    for key in ("topology", "world_size", "model", "micro_batch", "micro_batches", "global_batch", "dtype",
                "steps", "reference", "losses_agree", "void", "ratios", "rows", "tier_rates_mbit"):  # fmt: skip
        assert key in doc, key
    for row in doc["rows"]:
        for key, kind in ROW_KEYS.items():
            assert isinstance(row[key], kind), (row["name"], key, row[key])
        assert "predicted_step_time_s" in row and "peak_memory_bytes" in row
    assert set(doc["ratios"]) == {f"zerotopo/{n}" for n in DEFAULT_ROWS if n not in ("zerotopo", "no-comm")}
    assert doc["predicted_compute"].startswith("measured by the no-comm row")
    # each run ran in rank processes of its own, beside its own process groups alone (an idle gloo group
    # wakes every 10 ms): the floor holds the default group only, a sharded row the groups of its plan
    groups = {r["name"]: r["process_groups"] for r in doc["rows"]}
    assert all(len(g) == report["repeat"] for g in groups.values())
    assert groups["no-comm"] == [1] * report["repeat"]
    assert all(
        1 < n < 8 for name, g in groups.items() if name not in ("no-comm", "deepspeed-zero3") for n in g
    )
    # the transport's cost was measured on the ranks before the rows, and the predictions priced it
    tr = doc["transport"]
    assert tr["us_per_call"] > 0 and tr["us_per_mb"] >= 0 and tr["ranks_per_core"] >= 1
    assert [p["op"] for p in tr["probe"]] == ["all_gather", "reduce_scatter", "all_reduce"] * 2
    assert all(p["cpu_s"] > 0 and p["bytes_sent"] > 0 for p in tr["probe"])
    text = format_report(report)
    assert all(name in text for name in DEFAULT_ROWS) and "losses agree" in text
    assert f"transport (measured first, priced as compute lost): {tr['us_per_call']:g} us per call" in text
    png = tmp_path / "compare.png"
    plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@needs_netem
def test_shaped_links_count_bytes_per_tier(report):
    rows = {r["name"]: r for r in report["rows"]}
    assert report["tier_rates_mbit"] == {"package": 1600.0, "node": 400.0, "network": 100.0}
    for r in rows.values():
        assert set(r["tier_bytes_per_step"]) == {"package", "node", "network"}
        assert r["tier_bytes_per_step"]["package"] > 0
        assert r["peak_memory_bytes"] is not None
    # ZeRO-3 gathers every weight across nodes each micro-batch; MiCS keeps the weights in the node
    # and crosses nodes only with the step's gradient all-reduce
    assert (
        rows["zero3"]["tier_bytes_per_step"]["network"] > 1.5 * rows["mics"]["tier_bytes_per_step"]["network"]
    )
    assert (
        rows["deepspeed-zero3"]["tier_bytes_per_step"]["network"]
        > rows["mics"]["tier_bytes_per_step"]["network"]
    )


@pytest.mark.slow
@needs_netem
def test_bf16_halves_what_every_framework_sends(report):
    """``--dtype bf16`` (frontier-20b's default): each framework gathers and reduces in bf16, so the
    bytes that cross the shaped links halve against the fp32 run, the losses still agree, and the rows
    run with fp32 arithmetic (zerotopo_lab.bench.precision)."""
    rows = ("zero3", "deepspeed-zero3", "fsdp2-hsdp")
    opts = CompareOptions(topology=MINI, model="tiny", steps=2, warmup=1, micro_batches=2, batch=1,
                          seq=16, emulate=EMULATE, network_mbit=100, rows=rows, dtype="bf16")  # fmt: skip
    bf16 = compare(opts, command="test")
    assert bf16["dtype"] == "bf16" and bf16["losses_agree"], bf16["void"]
    fp32 = {r["name"]: r for r in report["rows"]}
    for r in bf16["rows"]:
        sent = sum(r["tier_bytes_per_step"].values())
        before = sum(fp32[r["name"]]["tier_bytes_per_step"].values())
        # payload halves; packet headers and acknowledgements do not
        assert 0.4 * before < sent < 0.65 * before, (r["name"], sent, before)
        assert r["final_loss"] == pytest.approx(fp32[r["name"]]["final_loss"], rel=2e-2)
    predicted = {r["name"]: r.get("predicted_tier_bytes") for r in bf16["rows"]}
    assert sum(predicted["zero3"].values()) == pytest.approx(
        sum(fp32["zero3"]["predicted_tier_bytes"].values()) / 2, rel=0.02
    )


def test_a_row_out_of_tolerance_voids_the_comparison():
    rows = [
        {"name": "zero3", "final_loss": 2.0, "quantized": False},
        {"name": "zeropp", "final_loss": 2.02, "quantized": True},  # 1%: within quantization error
        {"name": "fsdp2-hsdp", "final_loss": 2.01, "quantized": False},  # 0.5%: not for fp32 rows
        {"name": "deepspeed-hpz", "error": "ImportError: no deepspeed", "final_loss": None},
    ]
    ref, void = check_losses(rows)
    assert ref == "zero3"
    assert "fsdp2-hsdp" in void and "zeropp" not in void.split(":")[1] and "deepspeed-hpz" in void
    assert [r.get("loss_ok") for r in rows[:3]] == [True, True, False]
    assert check_losses(rows[:2]) == ("zero3", None)


def test_without_root_it_says_how_to_run_unemulated(monkeypatch):
    import zerotopo.launch.netem as netem

    monkeypatch.setattr(netem, "available", lambda: (False, "needs root for ip netns"))
    with pytest.raises(ZerotopoError, match="needs root.*--no-emulate"):
        compare(CompareOptions(topology=MINI, model="tiny", rows=("zero3",)))


@pytest.mark.slow
@needs_netem
def test_sigterm_tears_down_namespaces_and_ranks(tmp_path):
    from zerotopo.launch.netem import _namespace_pids, our_namespaces

    cmd = [sys.executable, "-m", "zerotopo.cli.main", "bench", "compare", "--topology", MINI, "--model",
           "tiny", "--steps", "1000", "--rows", "zero3"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        ranks: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            ours = our_namespaces(proc.pid)
            ranks = {pid for ns in ours for pid in _namespace_pids(ns)}
            if len(ranks) >= 4:
                break
            time.sleep(0.5)
        assert len(ranks) >= 4, f"the ranks never entered their namespaces (exit {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert our_namespaces(proc.pid) == []
    assert [pid for pid in ranks if os.path.exists(f"/proc/{pid}")] == []


def test_command_line_options():
    import argparse

    from zerotopo.cli.bench import add_collective_arguments, emulation
    from zerotopo.errors import ConfigError
    from zerotopo_lab.bench.compare import add_arguments, options_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = options_from_args(
        p.parse_args(["--rows", "zero3, fsdp2-hsdp", "--shape", "node=400", "--no-emulate"])
    )
    assert opts.rows == ("zero3", "fsdp2-hsdp") and opts.rates == {"node": 400.0} and not opts.emulate
    assert options_from_args(p.parse_args([])).rows == DEFAULT_ROWS
    with pytest.raises(ConfigError, match="unknown row 'zero4'"):
        compare(CompareOptions(topology=MINI, model="tiny", rows=("zero4",), emulate=False))
    c = argparse.ArgumentParser()
    add_collective_arguments(c)
    assert emulation(c.parse_args([])) is None
    assert emulation(c.parse_args(["--emulate", "--network-mbit", "20", "--shape", "package=500"])) == {
        "network_mbit": 20.0,
        "rates": {"package": 500.0},
    }


def test_predictions_price_the_shipped_table_or_a_calibration_file(tmp_path):
    """The default predictions use the topology file and its shipped bandwidth table; --calibration prices
    them with a measured file's tiers, curves and overlap instead (as `zerotopo plan --calibration`);
    a file measured on another topology is refused before any rank starts."""
    import argparse

    from zerotopo.cost.bandwidth import default_table
    from zerotopo.errors import ConfigError
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.compare import (
        add_arguments,
        cost_inputs,
        model_config,
        options_from_args,
        resolve_rows,
    )

    assert default_table("emulated-frontier") is not None  # shipped with the topology
    topo = load_topology("emulated-frontier")
    base = CompareOptions(rows=("zerotopo", "zero3"), emulate=False)
    cfg, seq = model_config(base)
    shape = cfg.shape(seq, name=base.model)
    same, measured = cost_inputs(base, topo)
    # the CPU ranks reduce on the computing thread, with or without a calibration file; their slowdown
    # under communication is the transport's processor time, measured at start and priced per call
    assert same is topo and measured == {"overlap": OverlapModel(host_reduce=True, compute_slowdown=0.0)}
    _, plain = resolve_rows(base, topo, shape)
    cal = Path(__file__).parents[3] / "docs" / "emulated-frontier-calibration.yaml"
    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = options_from_args(p.parse_args(["--rows", "zerotopo,zero3", "--calibration", str(cal)]))
    assert opts.calibration == str(cal)
    ctopo, measured = cost_inputs(opts, topo)
    assert measured["default_bandwidth"] is False and measured["overlap"].concurrent == 1
    assert measured["overlap"].host_reduce and measured["overlap"].compute_slowdown == 0
    assert ctopo.bandwidth_gbps("package") == pytest.approx(0.064307)
    _, priced = resolve_rows(opts, ctopo, shape, measured)
    for row in ("zerotopo", "zero3"):
        assert priced[row]["predicted"] > 0 and priced[row]["predicted"] != plain[row]["predicted"]
    other = tmp_path / "other.yaml"
    other.write_text(cal.read_text().replace("topology: emulated-frontier", "topology: emulated", 1))
    with pytest.raises(ConfigError, match="measured on topology 'emulated'"):
        compare(dataclasses.replace(opts, calibration=str(other), emulate=False))
