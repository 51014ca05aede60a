"""A rank's measured peak memory, for comparison with the cost model's per-device prediction.

On a GPU the peak is ``torch.cuda.max_memory_allocated`` since the probe started, less what was allocated
then. On the CPU it is the process's peak resident set (``VmHWM`` in ``/proc/self/status``, else
``getrusage``'s ``ru_maxrss``) less the resident set when the probe started (``baseline``: the interpreter,
torch, the process groups: what the rank holds before any model state exists). Where the kernel allows it
the probe resets ``VmHWM`` at start (``/proc/self/clear_refs``), so import-time peaks are not counted.

The same probe measures each row of ``zerotopo bench compare`` (:mod:`zerotopo_lab.bench.measure`): rows run
one after the other in the same processes, so before the baseline is read the previous row's objects are
collected and glibc hands freed pages back (:func:`release_memory`), and the baseline is only the
interpreter and the libraries every row shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import resource
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the peak resident set to the current one (Linux ``clear_refs`` value 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


#: glibc's mallopt parameter number for the mmap threshold (malloc.h: M_MMAP_THRESHOLD).
_M_MMAP_THRESHOLD = -3


def unmap_large_frees(threshold: int = 1 << 16) -> bool:
    """Serve every allocation of ``threshold`` bytes or more with its own mapping, returned to the OS when
    freed (glibc; returns False elsewhere).

    [Note: CPU ranks and glibc] The engine frees a whole unit after each use. glibc's default mmap
    threshold is dynamic: once a mapped block is freed it rises to that block's size (up to 32 MiB), so
    later unit-sized buffers come from the heap, whose freed holes stay resident. A CPU rank's resident
    set then grows well past what it holds. Setting the threshold turns that adjustment off; 64 KiB also
    maps the activations of small models (docs/training.md gives the measured resident peaks under each
    threshold, from benchmarks/memory_bench.py)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


def release_memory() -> None:
    """Collect garbage and give freed heap pages back to the OS (glibc), so the resident set is live data."""
    gc.collect()
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


class PeakMemory:
    """Start measuring now; :meth:`peak` is the most this rank held above :attr:`baseline` since."""

    def __init__(self, device: torch.device | None = None) -> None:
        device = torch.device("cpu") if device is None else device
        self.device = device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.baseline = torch.cuda.memory_allocated(device)
            self.method = "torch.cuda.max_memory_allocated"
            return
        release_memory()
        self.hwm_reset = _reset_hwm()
        rss = _status_bytes("VmRSS")
        if rss is not None:
            self.baseline = rss
            self.method = "peak resident set (VmHWM)" + ("" if self.hwm_reset else ", not reset at start")
        else:  # no /proc: ru_maxrss (kB on Linux) since the process started
            self.baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "getrusage ru_maxrss"

    def peak(self) -> int:
        """Bytes above :attr:`baseline` at the peak so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline)
        hwm = _status_bytes("VmHWM")
        if hwm is None:
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, hwm - self.baseline)

    def peak_bytes(self) -> int | None:
        """:meth:`peak`, or None on a CPU without ``/proc`` (``ru_maxrss`` is never reset, so it cannot
        tell one measurement from the one before it in the same process)."""
        if self.device.type != "cuda" and _status_bytes("VmHWM") is None:
            return None
        return self.peak()
