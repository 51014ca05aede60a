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


def thread_times(path: str = SCHEDSTAT) -> ThreadTimes:
    """The calling thread's processor time and run-queue delay so far; where the kernel does not
    report them (no schedstat), its processor time (``time.thread_time``) and no delay."""
    try:
        with open(path) as f:
            run_ns, wait_ns = f.read().split()[:2]
        return ThreadTimes(int(run_ns) / 1e9, int(wait_ns) / 1e9)
    except (OSError, ValueError):
        return ThreadTimes(time.thread_time(), 0.0)
