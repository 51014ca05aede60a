"""Learning-rate schedules: warmup, then constant/linear/cosine decay to the floor."""

from __future__ import annotations

import math

import pytest

from zerotopo.trainer.lr_schedule import LRSchedule


def test_warmup_rises_linearly_to_the_peak():
    s = LRSchedule.from_args(lr=1e-3, min_lr=1e-4, warmup=0.1, decay_iters=100, style="cosine")
    assert s.warmup_iters == 10
    assert s(0) == pytest.approx(1e-4)
    assert s(4) == pytest.approx(5e-4)
    assert s(9) == pytest.approx(1e-3)


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_decay_reaches_min_lr_and_stays(style):
    s = LRSchedule.from_args(lr=1e-3, min_lr=1e-4, warmup=0.0, decay_iters=50, style=style)
    assert s(0) == pytest.approx(1e-3)
    assert s(50) == pytest.approx(1e-4)
    assert s(500) == pytest.approx(1e-4)
    values = [s(i) for i in range(51)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_cosine_midpoint_and_linear_midpoint():
    cos = LRSchedule.from_args(lr=2.0, min_lr=0.0, warmup=0.0, decay_iters=100, style="cosine")
    lin = LRSchedule.from_args(lr=2.0, min_lr=0.0, warmup=0.0, decay_iters=100, style="linear")
    assert cos(50) == pytest.approx(1.0)
    assert cos(25) == pytest.approx(1.0 + math.cos(math.pi / 4))
    assert lin(25) == pytest.approx(1.5)


def test_constant_and_bad_style():
    s = LRSchedule.from_args(lr=3e-4, min_lr=0.0, warmup=0.0, decay_iters=10, style="constant")
    assert {s(i) for i in range(20)} == {3e-4}
    with pytest.raises(ValueError, match="lr_decay_style"):
        LRSchedule.from_args(lr=1.0, min_lr=0.0, warmup=0.0, decay_iters=10, style="exponential")
