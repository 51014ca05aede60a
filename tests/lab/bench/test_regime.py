"""The regime ``bench compare`` reports: the target's R from the cost model, the measured R from the
zero3 and no-comm rows."""

from __future__ import annotations

import pytest

from zerotopo_lab.bench.regime import measured_ratio, measured_ratios, target_regime


def test_target_regime_is_the_cost_models_zero3_ratio_at_48_frontier_nodes():
    t = target_regime()
    assert "48 frontier nodes" in t.description and "micro-batch 4" in t.description
    # the engine's ZeRO-3 moves its flat per-layer messages outside the curves' slow band; DeepSpeed's
    # per-module gathers fall inside it and communicate about as long as they compute
    assert 0.05 < t.zero3 < 0.5
    assert 0.8 < t.deepspeed_zero3 < 1.5
    assert t.deepspeed_zero3 > t.zero3


def test_the_target_is_found_from_any_directory(tmp_path, monkeypatch):
    # `zerotopo bench scale` started outside the repository read configs/neox-20b.yml relative to the
    # working directory and stopped; the target is the built-in config
    from zerotopo_lab.bench import regime

    regime._target.cache_clear()
    monkeypatch.chdir(tmp_path)
    shape, _ = regime._target(regime.TARGET_MODEL)
    assert (shape.hidden_size, shape.num_layers) == (6144, 44)


def test_measured_ratio_from_the_rows():
    rows = [{"name": "no-comm", "step_time_s": 0.5}, {"name": "zero3", "step_time_s": 0.8}]
    assert measured_ratio(rows) == pytest.approx(0.6)
    assert measured_ratio(rows[:1]) is None
    assert measured_ratio([{"name": "zero3", "step_time_s": None}, rows[0]]) is None


def test_measured_ratio_pairs_the_runs_of_each_repeat():
    # the machine ran 20% slower in the second repeat: each repeat's zero3 against that repeat's floor
    # gives 0.2 every time, where the rows' medians (5.0 and 6.6) would give 0.32
    rows = [
        {"name": "no-comm", "step_time_s": 5.0, "repeat_step_times_s": [5.0, 6.0, 4.9]},
        {"name": "zero3", "step_time_s": 6.6, "repeat_step_times_s": [6.0, 7.2, 5.88]},
    ]
    assert measured_ratios(rows) == pytest.approx([0.2, 0.2, 0.2])
    assert measured_ratio(rows) == pytest.approx(0.2)
    rows[1]["repeat_step_times_s"] = [6.0, 9.0, 5.39]
    assert measured_ratio(rows) == pytest.approx(0.2)  # the median pair, not the mean
    assert measured_ratios(rows) == pytest.approx([0.2, 0.5, 0.1])


def test_the_compute_rate_is_the_compute_floors_step(monkeypatch):
    # the rate is the model's FLOPs over the median step of the no-comm row, spawned as the rows are
    from pathlib import Path

    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench import compare as C

    mini = str(Path(__file__).with_name("mini-frontier.yaml"))
    topo = load_topology(mini)
    opts = C.CompareOptions(topology=mini, model="tiny", emulate=False)
    cfg, seq = C.model_config(opts)
    flops = cfg.shape(seq).step_flops(2, checkpoint_activations=cfg.checkpoint_activations)
    rate = C.measure_compute(opts, topo, cfg, seq, 2)  # 4 real ranks of the tiny model
    assert 1e6 < rate < 1e13
    seen = {}

    def fake(fn, args, opts_, topo_, network):
        seen.update(fn=fn, args=args, network=network)
        return [[{"name": "no-comm", "step_times_s": [0.5, 2.0, 1.0]}]] + [[{"step_times_s": [9.0]}]] * 3

    monkeypatch.setattr(C, "_spawn", fake)
    assert C.measure_compute(opts, topo, cfg, seq, 2) == pytest.approx(flops / 1.0)
    assert seen["fn"] is C._worker and seen["network"] is None  # before the links exist
    floor, runs, _ = seen["args"]
    assert runs == [(0, "no-comm", None)]
    assert (floor.batch, floor.seq, floor.micro_batches, floor.steps) == (2, seq, 1, C.COMPUTE_STEPS)

    def failed(fn, args, opts_, topo_, network):
        return [[{"name": "no-comm", "error": "ImportError: boom"}]] * 4

    monkeypatch.setattr(C, "_spawn", failed)
    with pytest.raises(C.ZerotopoError, match="no-comm row failed.*boom"):
        C.measure_compute(opts, topo, cfg, seq, 2)


def test_the_report_prints_the_repeats_range_of_the_measured_ratio():
    from zerotopo_lab.bench.compare import _regime_lines

    regime = {"name": "frontier-20b", "target": "t", "target_R": 0.2, "target_R_deepspeed_zero3": 1.1,
              "measured_R": 0.15, "measured_R_repeats": [-0.17, 0.22, 0.15]}  # fmt: skip
    line = _regime_lines({}, regime)[0]
    assert "measured 0.15 (median of the repeats, -0.17 to 0.22)" in line
    regime["measured_R_repeats"] = [0.15]
    assert "repeats" not in _regime_lines({}, regime)[0]


def test_predictions_are_priced_at_the_median_of_every_floor_run_the_start_one_included():
    # the floor's three repeats read 5.45, 4.67 and 4.45 s and the start run 5.38 s: the rate is the
    # model's FLOPs over 5.025 s (the median of four), not over 4.67 s (the repeats' median)
    from pathlib import Path

    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench import compare as C

    mini = str(Path(__file__).with_name("mini-frontier.yaml"))
    topo = load_topology(mini)
    opts = C.CompareOptions(topology=mini, model="tiny", emulate=False)
    cfg, seq = C.model_config(opts)
    shape = cfg.shape(seq)
    flops = shape.step_flops(opts.batch * opts.micro_batches, checkpoint_activations=opts.checkpoint)
    floor = {
        "name": "no-comm",
        "kind": "floor",
        "step_time_s": 4.67,
        "repeat_step_times_s": [5.45, 4.67, 4.45],
    }
    assert C.floor_steps(floor, 5.38) == [5.45, 4.67, 4.45, 5.38]
    assert C.floor_steps(floor) == [5.45, 4.67, 4.45]
    assert C.floor_steps({"step_time_s": 3.0}) == [3.0]
    meta = {"no-comm": {}}
    said = C.repredict([floor], meta, opts, topo, shape, None, flops / 5.38)  # the start run's rate
    assert f"{flops / 5.025 / 1e9:.3f} GFLOPS per rank (median of its 4 runs, the start's included)" in said
    said = C.repredict([floor], meta, opts, topo, shape)
    assert f"{flops / 4.67 / 1e9:.3f} GFLOPS per rank (median of its runs)" in said
