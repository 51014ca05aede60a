"""The regime ``bench compare`` reports: the target's R from the cost model, the measured R from the
zero3 and no-comm rows."""

from __future__ import annotations

import pytest

from zerotopo.bench.regime import measured_ratio, target_regime


def test_target_regime_is_the_cost_models_zero3_ratio_at_48_frontier_nodes():
    t = target_regime()
    assert "48 frontier nodes" in t.description and "micro-batch 4" in t.description
    # the engine's ZeRO-3 moves its flat per-layer messages outside the curves' slow band; DeepSpeed's
    # per-module gathers fall inside it and communicate about as long as they compute
    assert 0.05 < t.zero3 < 0.5
    assert 0.8 < t.deepspeed_zero3 < 1.5
    assert t.deepspeed_zero3 > t.zero3


def test_measured_ratio_from_the_rows():
    rows = [{"name": "no-comm", "step_time_s": 0.5}, {"name": "zero3", "step_time_s": 0.8}]
    assert measured_ratio(rows) == pytest.approx(0.6)
    assert measured_ratio(rows[:1]) is None
    assert measured_ratio([{"name": "zero3", "step_time_s": None}, rows[0]]) is None
