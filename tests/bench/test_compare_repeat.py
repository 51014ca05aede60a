"""``bench compare --repeat N``: every row runs N times; its figure is the median of the runs' medians,
reported with their min and max, and the ratios between rows come from those medians."""

from __future__ import annotations

import argparse

import pytest

from zerotopo.bench.compare import (
    DEFAULT_REPEAT,
    CompareOptions,
    add_arguments,
    assemble,
    format_report,
    options_from_args,
    ratios,
)
from zerotopo.errors import ConfigError


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
