"""``bench compare --repeat N``: every row runs N times; its figure is the median of the runs' medians,
reported with their min and max, and the ratios between rows come from those medians."""

from __future__ import annotations

import argparse

import pytest

from zerotopo.errors import ConfigError
from zerotopo_lab.bench.compare import (
    DEFAULT_REPEAT,
    CompareOptions,
    add_arguments,
    assemble,
    format_report,
    options_from_args,
    ratios,
    run_order,
)


def _run(name: str, repeat: int, times: list[float], peak: int) -> dict:
    return {"name": name, "repeat": repeat, "degrees": "p=8 g=8 o=8", "step_times_s": times,
            "losses": [2.0, 1.5], "tier_bytes": {"node": 10.0}, "peak_memory_bytes": peak,
            "setup_s": 0.1, "cpu_s": [0.5, 0.7]}  # fmt: skip


def test_rows_are_medians_of_their_runs_with_the_spread():
    opts = CompareOptions(rows=("zerotopo", "zero3"), repeat=3)
    meta = {n: {"kind": "zerotopo", "plan": n, "predicted": 1.0, "quantized": False} for n in opts.rows}
    # the worker interleaves: every row, then every row again
    steps = {"zerotopo": ([1.0, 1.2], [3.0, 3.0], [1.1, 1.1]), "zero3": ([2.0, 2.0], [2.2, 2.4], [9.0, 1.0])}
    per_rank = [
        [_run(n, k, steps[n][k], 100 * (k + 1) + rank) for k in range(3) for n in opts.rows]
        for rank in range(2)
    ]
    rows = assemble(opts, per_rank, meta, tokens_per_step=1000)
    z, z3 = rows
    assert z["repeat_step_times_s"] == pytest.approx([1.1, 3.0, 1.1])
    assert z["step_time_s"] == pytest.approx(1.1)  # the slow run moves the spread, not the figure
    assert (z["step_time_min_s"], z["step_time_max_s"]) == pytest.approx((1.1, 3.0))
    assert z3["step_time_s"] == pytest.approx(2.3) and z3["step_time_max_s"] == pytest.approx(5.0)
    assert z["peak_memory_bytes_per_rank"] == [300, 301]  # each rank's largest over the runs
    assert z["cpu_s_per_step"] == pytest.approx(2 * 0.6)  # each rank's median, summed over the ranks
    assert ratios(rows)["zerotopo/zero3"] == pytest.approx(2.3 / 1.1)
    report = {"topology": "t", "world_size": 2, "tier_rates_mbit": {}, "model": {"name": "tiny",
              "parameters": 1, "hidden": 1, "layers": 1, "vocab": 1, "seq": 1}, "micro_batches": 1,
              "micro_batch": 1, "global_batch": 2, "dtype": "fp32", "steps": 2, "warmup": 0, "repeat": 3,
              "predicted_compute": "-", "ratios": ratios(rows), "planner_pick": None,
              "losses_agree": True, "reference": "zerotopo", "rows": rows, "emulated": False}  # fmt: skip
    text = format_report(report)
    assert "3 runs per row" in text and "1.100-3.000" in text


def test_repeat_flag():
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert options_from_args(p.parse_args([])).repeat == DEFAULT_REPEAT == 3
    assert options_from_args(p.parse_args(["--repeat", "5"])).repeat == 5
    with pytest.raises(ConfigError, match="--repeat"):
        options_from_args(p.parse_args(["--repeat", "0"]))


def test_every_repeat_starts_further_on_so_no_row_always_runs_first():
    order = run_order(10, 3)
    assert len(order) == 30 and sorted(order) == [(k, i) for k in range(3) for i in range(10)]
    assert [k for k, _ in order] == sorted(k for k, _ in order)  # every row, then every row again
    positions = {i: [n % 10 for n, (_, j) in enumerate(order) if j == i] for i in range(10)}
    # each repeat opens with another row, and every row's mean place lies within 1.5 of the middle
    # (4.5; run first every time, a row would sit at 0 and the last at 9)
    assert len({order[10 * k][1] for k in range(3)}) == 3
    assert all(abs(sum(ps) / 3 - 4.5) <= 1.5 for ps in positions.values()), positions
    assert run_order(3, 1) == [(0, 0), (0, 1), (0, 2)]  # one repeat: the rows in their order
