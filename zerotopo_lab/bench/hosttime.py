"""Where a rank's thread spent a stretch of wall time: running, waiting for a core, or neither.

On CPU ranks that outnumber the cores, a thread that could run may wait in the scheduler's run queue for
a core; a device's stream does not. Linux counts both per thread (``/proc/thread-self/schedstat``: the
nanoseconds run, the nanoseconds spent runnable on a run queue, the time slices), so a stretch of wall
time splits into the thread's processor time, its run-queue delay, and the rest: asleep (the device
clock's waits) or blocked (on a collective, a barrier, another thread).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

SCHEDSTAT = "/proc/thread-self/schedstat"


@dataclass(frozen=True)
class ThreadTimes:
    """Cumulative seconds of the calling thread: on a core, and runnable without one."""

    cpu_s: float
    run_delay_s: float

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.cpu_s - other.cpu_s, self.run_delay_s - other.run_delay_s)


def _schedstat(path: str) -> ThreadTimes | None:
    """A thread's times from its schedstat file; None where it cannot be read (no such thread)."""
    try:
        with open(path) as f:
            run_ns, wait_ns = f.read().split()[:2]
        return ThreadTimes(int(run_ns) / 1e9, int(wait_ns) / 1e9)
    except (OSError, ValueError):
        return None


def thread_times(path: str = SCHEDSTAT) -> ThreadTimes:
    """The calling thread's processor time and run-queue delay so far; where the kernel does not
    report them (no schedstat), its processor time (``time.thread_time``) and no delay."""
    return _schedstat(path) or ThreadTimes(time.thread_time(), 0.0)


def other_threads() -> dict[int, ThreadTimes]:
    """The cumulative times of every other thread of this process, by thread id (on Linux; empty
    elsewhere): on a rank, its transport (the gloo workers of its process groups) and copy engine."""
    import os
    import threading

    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return {}
    times = {tid: _schedstat(f"/proc/self/task/{tid}/schedstat") for tid in tids if tid != me}
    return {tid: t for tid, t in times.items() if t is not None}  # a thread may have ended meanwhile


def others_since(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes]) -> ThreadTimes:
    """What the other threads spent between two :func:`other_threads` readings (a thread started in
    between counts from zero; one that ended is lost)."""
    zero = ThreadTimes(0.0, 0.0)
    spent = [after[t] - before.get(t, zero) for t in after]
    return ThreadTimes(sum(x.cpu_s for x in spent), sum(x.run_delay_s for x in spent))
