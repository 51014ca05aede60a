"""A thread's processor time and run-queue delay, read from the kernel's per-thread schedstat."""

from __future__ import annotations

import time

import pytest

from zerotopo_lab.bench.hosttime import ThreadTimes, thread_times


def test_schedstat_is_read_as_seconds(tmp_path):
    path = tmp_path / "schedstat"
    path.write_text("2500000000 125000000 42\n")
    assert thread_times(str(path)) == ThreadTimes(2.5, 0.125)


def test_without_schedstat_the_processor_time_and_no_delay(tmp_path):
    got = thread_times(str(tmp_path / "missing"))
    assert got.run_delay_s == 0.0
    assert got.cpu_s == pytest.approx(time.thread_time(), abs=0.05)


def test_arithmetic_counts_and_sleep_does_not():
    before = thread_times()
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:
        pass
    time.sleep(0.05)
    spent = thread_times() - before
    assert 0.04 <= spent.cpu_s < 0.09
    assert spent.run_delay_s >= 0.0
