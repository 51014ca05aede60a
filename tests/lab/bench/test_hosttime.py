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


def test_the_other_threads_time_is_theirs_and_a_thread_started_between_counts_from_zero():
    import threading

    from zerotopo_lab.bench.hosttime import ThreadTimes, other_threads, others_since

    before = other_threads()
    spun, done = threading.Event(), threading.Event()

    def spin():
        deadline = time.thread_time() + 0.05
        while time.thread_time() < deadline:
            pass
        spun.set()
        done.wait()  # alive while it is read

    t = threading.Thread(target=spin)
    t.start()
    mine = thread_times()
    spun.wait()
    after = other_threads()
    done.set()
    t.join()
    assert t.native_id in after and t.native_id not in before
    assert threading.get_native_id() not in after
    spent = others_since(before, after)
    assert 0.05 <= spent.cpu_s < 0.5  # the spinning thread's, not this one's
    assert (thread_times() - mine).cpu_s < 0.05
    assert others_since(after, after) == ThreadTimes(0.0, 0.0)


def test_a_rows_clock_figures_hold_its_transport_threads_times():
    from zerotopo_lab.bench.compare import _clock_figures

    def rank(others_delay):
        return {"clock_waited_s": 8.0, "clock_arithmetic_s": 1.0, "clock_device_s": 9.0, "clock_overshoot_s": 0.0,
                "thread_cpu_s": 0.5, "run_delay_s": 0.5, "others_cpu_s": 0.2, "others_run_delay_s": others_delay,
                "step_times_s": [12.0]}  # fmt: skip

    fig = _clock_figures([rank(1.0), rank(3.0)])
    assert fig["others_run_delay_s_per_step"] == pytest.approx(2.0)
    assert fig["others_cpu_s_per_step"] == pytest.approx(0.2)
    assert fig["blocked_s_per_step"] == pytest.approx(12.0 - 8.0 - 1.0)
