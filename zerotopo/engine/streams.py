"""Streams, ready-events, the emulated copy engine and the ordering sanitizer.

[Note: ready-events] Every buffer that crosses from one stream (or the copy engine) to another travels as
a :class:`Ready` holder: the tensor plus the event that marks it written. A consumer calls
:meth:`Ready.wait` before it reads; :meth:`Ready.wait` makes the *consumer's* stream wait on the event
(device) or blocks the reading thread (the CPU emulation), and records that the wait happened so the
sanitizer can check rule 1 (docs/engine.md, "Synchronization") cheaply: one flag per holder, checked when a
collective reads it.

[Note: emulated copy engine] A CPU has no streams, so the race of Dai et al., "Enhancing Stability for
Large Models Training in Constrained Bandwidth Networks" (ICML 2024 ES-FoMo workshop) (the secondary partition
written by an asynchronous device-to-device copy into an uninitialized buffer while a prefetched
all-gather already reads it) cannot happen by itself. :class:`CopyEngine` is a worker thread that lands
each copy ``delay`` seconds after it was issued, into a destination that was poisoned with NaN when it
was allocated, and sets an :class:`EmulatedEvent` when it has landed. The unordered hook (``DebugOptions(unordered_secondary=True)``) never waits on that
event, so a gather that runs before the copy landed reads NaN, exactly like the uninitialized buffer of
stock hpZ.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from zerotopo.errors import ZerotopoError

DELAY_ENV = "ZEROTOPO_EMULATED_COPY_DELAY_MS"
#: Clock assumed to turn a copy delay into spin cycles on a device (about an H100's or MI250X's).
DEVICE_CLOCK_HZ = 1.5e9


class OrderingError(ZerotopoError):
    """A collective read a buffer whose ready-event its consumer never waited on (docs/engine.md,
    "Synchronization", rule 1)."""


class EmulatedEvent:
    """The CPU copy engine's stand-in for a device event: set when the copy has landed."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def set(self) -> None:
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        """Block the calling thread until the copy landed (re-raising a failed copy's error)."""
        self._done.wait()
        if self.error is not None:
            raise self.error


@dataclass
class Ready:
    """A buffer and the event that marks it written; ``what`` names it for error messages."""

    tensor: Any
    event: Any = None
    what: str = ""
    waited: bool = field(default=False)

    def wait(self, stream: Any = None) -> Any:
        """Order the consumer after the producer: the stream waits on the event (device), or the thread
        blocks until the emulated copy landed (CPU). Returns the tensor."""
        ev = self.event
        if ev is not None:
            if isinstance(ev, EmulatedEvent):
                ev.synchronize()
            else:
                (stream or torch.cuda.current_stream()).wait_event(ev)
        self.waited = True
        return self.tensor

    def host_wait(self) -> None:
        """Block the host until the producer finished (DeepSpeed's fix: ``sync: host``)."""
        if self.event is not None:
            self.event.synchronize()

    def landed(self) -> bool:
        ev = self.event
        return ev is None or ev.query()


class CopyEngine:
    """A worker thread that performs copies ``delay`` seconds after they were issued (see the note).

    Copies land in issue order; each sets its event when done. ``delay`` is a latency, not a serial
    cost: copies issued together land together, like DMA engines working in parallel with compute.
    """

    def __init__(self, delay_s: float = 0.0, *, name: str = "zerotopo-copy-engine") -> None:
        self.delay_s = float(delay_s)
        self._queue: list[tuple[float, int, Callable[[], None], EmulatedEvent]] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> EmulatedEvent:
        """Run ``fn`` on the engine after the delay; returns the event that is set when it finished."""
        ev = EmulatedEvent()
        with self._cv:
            heapq.heappush(self._queue, (time.monotonic() + self.delay_s, next(self._seq), fn, ev))
            self._cv.notify()
        return ev

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed and not self._queue:
                    return
                due, _, fn, ev = self._queue[0]
                now = time.monotonic()
                if due > now:
                    self._cv.wait(due - now)
                    continue
                heapq.heappop(self._queue)
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - surfaced to the waiter
                ev.error = exc
            ev.set()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=5)


def emulated_delay_s(delay_ms: float | None) -> float:
    """The copy delay: the explicit argument, else ``$ZEROTOPO_EMULATED_COPY_DELAY_MS``, else 0."""
    if delay_ms is None:
        delay_ms = float(os.environ.get(DELAY_ENV, "0") or 0)
    if delay_ms < 0:
        raise ZerotopoError(f"emulated copy delay must be >= 0 ms, got {delay_ms}")
    return delay_ms / 1000.0


class Streams:
    """The engine's streams: all-gather, reduce-scatter, secondary copy and step-end reduction
    (CUDA/ROCm), or none (CPU) with the emulated copy engine standing in for the copy stream and a
    worker thread for the step-end reductions (:meth:`run_async`)."""

    def __init__(self, device: torch.device, *, copy_delay_s: float = 0.0) -> None:
        self.device = device
        self.on_device = device.type == "cuda"
        # On a device the delay is a spin kernel queued on the copy stream before each copy (the race
        # reproduction of the gpu tests); its length in cycles assumes a clock of DEVICE_CLOCK_HZ.
        self.copy_delay_cycles = int(copy_delay_s * DEVICE_CLOCK_HZ) if self.on_device else 0
        if self.on_device:
            self.all_gather = torch.cuda.Stream(device=device)
            self.reduce_scatter = torch.cuda.Stream(device=device)
            self.copy = torch.cuda.Stream(device=device)
            self.replica = torch.cuda.Stream(device=device)
            self.engine: CopyEngine | None = None
        else:
            self.all_gather = self.reduce_scatter = self.copy = self.replica = None
            self.engine = CopyEngine(copy_delay_s)
        self._worker: CopyEngine | None = None

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.on_device else None

    def record(self, stream: Any) -> Any:
        """An event recorded on ``stream`` (None on CPU, where collectives complete on the host)."""
        if not self.on_device:
            return None
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def copy_async(self, what: str, dst: Any, fn: Callable[[], None], src: torch.Tensor) -> Ready:
        """Issue the secondary-partition write ``fn`` (which fills ``dst`` from ``src``) asynchronously.

        Device: on the copy stream, after the compute stream's work that produced ``src``; ``src`` is
        marked used by the copy stream so freeing it is deferred by the allocator. CPU: on the emulated
        copy engine (``fn`` must already hold what it reads, see the note).
        """
        if self.on_device:
            self.copy.wait_stream(self.current())
            with torch.cuda.stream(self.copy):
                if self.copy_delay_cycles:
                    torch.cuda._sleep(self.copy_delay_cycles)
                fn()
            src.record_stream(self.copy)
            for t in (dst.data, dst.scales) if hasattr(dst, "scales") else (dst,):
                t.record_stream(self.copy)
            return Ready(dst, self.record(self.copy), what)
        assert self.engine is not None
        return Ready(dst, self.engine.submit(fn), what)

    def run_async(self, what: str, fn: Callable[[], Any], after: Any = None) -> Ready:
        """Run ``fn`` (collectives of the step-end reduction) beside compute; the returned holder's
        :meth:`Ready.wait` orders a consumer after it and its ``tensor`` is ``fn``'s result.

        Device: on the replica stream, after the work queued so far on ``after`` (default: the current
        stream); CPU: on a worker thread, in submission order (every rank submits the same collectives
        in the same order, so the groups it uses see one order on every rank)."""
        if self.on_device:
            self.replica.wait_stream(after if after is not None else self.current())
            with torch.cuda.stream(self.replica):
                out = fn()
            return Ready(out, self.record(self.replica), what)
        if self._worker is None:
            self._worker = CopyEngine(0.0, name="zerotopo-step-end-reduce")
        holder = Ready(None, None, what)

        def job() -> None:
            holder.tensor = fn()

        holder.event = self._worker.submit(job)
        return holder

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self._worker is not None:
            self._worker.close()


class Sanitizer:
    """Checks rule 1 on every collective input that crossed streams: its event was waited first."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.checked = 0

    def check(self, ready: Ready, *, unit: str, op: str) -> None:
        if not self.enabled:
            return
        self.checked += 1
        if not ready.waited:
            state = "had not landed yet" if not ready.landed() else "had landed by chance"
            raise OrderingError(
                f"unit {unit!r}: {op} read {ready.what or 'a buffer'} before waiting on its ready-event "
                f"(the producer's write {state}); order the read after the event (plan sync: event "
                f"or host), not unordered_secondary"
            )
