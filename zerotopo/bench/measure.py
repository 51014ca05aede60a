"""Probes a benchmark row runs inside each rank: memory high-water mark and per-tier link counters.

[Note: peak memory on CPU] Ranks are processes, so a row's peak is the process's resident-set
high-water mark (``VmHWM``). Rows run one after the other in the same processes; before each row the
previous row's objects are collected, glibc is asked to hand freed pages back (``malloc_trim``), and the
high-water mark is reset to the current resident set (``/proc/self/clear_refs``, value 5). The row's
peak is then ``VmHWM - VmRSS`` at its start: every byte the row held at once (its model states, gathered
weights, activations, communication buffers and the full model it was built from), not the interpreter
and libraries every row shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(re.findall(r"\d+", line)[0])
    except OSError:
        pass
    return None


def release_memory() -> None:
    """Collect garbage and give freed heap pages back to the OS (glibc), so the resident set is live data."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak resident memory of one row above the resident set at its start (see the note above)."""

    def __init__(self) -> None:
        release_memory()
        self.start_kib = _status_kib("VmRSS") or 0
        self.exact = False
        with contextlib.suppress(OSError):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.exact = True

    def peak_bytes(self) -> int | None:
        """Bytes above the start at the high-water mark (None where /proc is unavailable)."""
        hwm = _status_kib("VmHWM")
        if hwm is None:
            return None
        return max(0, hwm - self.start_kib) * 1024


def link_tier_bytes(tier_classes: dict[str, str]) -> dict[str, int]:
    """Bytes sent so far on this rank's shaped link, per tier (the htb class counters of ``eth0`` in the
    rank's own network namespace); {} when there is no emulated link."""
    if not tier_classes:
        return {}
    from zerotopo.launch.netem import class_bytes

    counters = class_bytes("eth0")
    return {tier: counters.get(cls, 0) for tier, cls in tier_classes.items()}
