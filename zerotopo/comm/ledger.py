"""The communication ledger: every collective a rank issued, its bytes, the tier it crossed, its time.

Bytes are this rank's sent bytes as :mod:`zerotopo.placement.volume` counts them (ring/direct algorithms), the
same figures the cost model predicts, so a step's ledger can be compared with the model byte for byte.
Times are wall-clock seconds from issue to completion: measured on the host on CPU, with CUDA events on
an accelerator.

[Note: lazy timing] A ledger never makes the host wait. :meth:`Ledger.mark_step` closes a step from the
bytes alone (known on the host when the collective is issued) and touches no event. Event times are
resolved only when asked: :meth:`Ledger.poll` (the logging interval) turns the events that have
completed into seconds with the non-blocking ``Event.query()`` and leaves the others pending;
:meth:`Ledger.records` and :meth:`Ledger.step_summary` (default ``block=True``) wait for them, for tests
and benchmarks that read every time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

#: Messages of at most this many elements are control traffic (gradient norm, overflow flag).
SCALAR_NUMEL = 16


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` -> ``bfloat16``; strings pass through."""
    return str(dtype).removeprefix("torch.")


@dataclass
class Record:
    """One collective as this rank saw it."""

    op: str
    """Collective name: ``all_gather``, ``reduce_scatter``, ``all_gather_int8``, ..."""
    kind: str
    """Group kind (``params``, ``grads_inter``, ...)."""
    size: int
    """Group size (the degree)."""
    tier: str | None
    """Outermost tier the group crosses; None for a single rank."""
    dtype: str
    """Element type of the logical message (``int8``/``int4`` for quantized payloads)."""
    numel: int
    """Elements of the whole message (gathered output, reduce-scatter input)."""
    bytes_sent: int
    """Bytes this rank sent, from :mod:`zerotopo.placement.volume`."""
    seconds: float
    """Wall time from issue to completion."""
    tag: str = ""
    """Caller's label (unit name, phase)."""
    timing: Any = field(default=None, repr=False, compare=False)
    """Pending CUDA events ``(start, end)``; ``seconds`` is filled in from them when read."""

    @property
    def is_scalar(self) -> bool:
        return self.numel <= SCALAR_NUMEL

    @property
    def pending(self) -> bool:
        """Whether the time is still a pair of device events."""
        return self.timing is not None and self.timing[1] is not None

    def resolve(self, block: bool = True) -> bool:
        """Turn pending CUDA events into seconds; ``block=False`` only when the end event has completed
        (``Event.query()``, no wait). Returns whether ``seconds`` holds the time."""
        if not self.pending:
            return True
        start, end = self.timing
        if block:
            end.synchronize()
        elif not end.query():
            return False
        self.seconds = start.elapsed_time(end) / 1e3
        self.timing = None
        return True


def _tier_key(tier: str | None) -> str:
    return tier if tier is not None else "local"


class Ledger:
    """Records of one rank's collectives, with per-step summaries by tier and by op.

    Totals (:meth:`bytes_by_tier`, :meth:`bytes_by_op`) cover everything since the last :meth:`reset`;
    the records themselves are kept for the step in progress and the last ``keep_steps`` closed steps
    (None: all), so a long training run does not accumulate millions of them.
    """

    def __init__(self, *, keep_steps: int | None = 16) -> None:
        self.keep_steps = keep_steps
        self._records: list[Record] = []
        self._step_starts: list[int] = []  # index in _records where each retained closed step began
        self._step_start = 0
        self._tier_all: dict[str, int] = defaultdict(int)
        self._tier_no_scalar: dict[str, int] = defaultdict(int)
        self._op_tier: dict[tuple[str, str | None], int] = defaultdict(int)
        self.steps_marked = 0
        # The engine's step-end reductions of the last backward record from a worker thread on CPU.
        self._lock = threading.Lock()

    def record(
        self,
        op: str,
        group: Any,
        *,
        dtype: torch.dtype | str,
        numel: int,
        bytes_sent: int,
        seconds: float,
        tag: str = "",
    ) -> Record:
        """Add one collective on ``group`` (a :class:`~zerotopo.comm.mesh.GroupHandle`); returns the record
        so an asynchronous collective can fill in its time when it completes."""
        rec = Record(
            op=op,
            kind=group.kind,
            size=group.size,
            tier=group.tier,
            dtype=dtype_name(dtype),
            numel=int(numel),
            bytes_sent=int(bytes_sent),
            seconds=float(seconds),
            tag=tag,
        )
        key = _tier_key(rec.tier)
        with self._lock:
            self._records.append(rec)
            self._tier_all[key] += rec.bytes_sent
            if not rec.is_scalar:
                self._tier_no_scalar[key] += rec.bytes_sent
            self._op_tier[(rec.op, rec.tier)] += rec.bytes_sent
        return rec

    def records(self) -> list[Record]:
        """The retained records (see the class note), oldest first."""
        for r in self._records:
            r.resolve()
        return list(self._records)

    def bytes_by_tier(self, *, include_scalar: bool = True) -> dict[str, int]:
        """Bytes sent per tier crossed (``local`` for single-rank groups) since the last reset;
        ``include_scalar=False`` leaves out control messages of at most :data:`SCALAR_NUMEL` elements."""
        return dict(self._tier_all if include_scalar else self._tier_no_scalar)

    def bytes_by_op(self) -> dict[tuple[str, str | None], int]:
        """Bytes sent per ``(op, tier)`` since the last reset."""
        return dict(self._op_tier)

    def poll(self) -> int:
        """Resolve the retained records whose events completed (never waits); returns how many are
        still pending. Call it at the logging interval."""
        return sum(not r.resolve(block=False) for r in self._records)

    @staticmethod
    def summarize(records: list[Record], *, block: bool = True, resolve: bool = True) -> dict:
        """Totals of ``records``: bytes by tier, bytes and seconds by op, calls.

        ``block=False`` resolves only completed events; ``resolve=False`` touches no event at all (the
        seconds then cover the records already resolved). ``pending`` counts records whose time is
        left out."""
        seconds: dict[str, float] = defaultdict(float)
        by_op: dict[str, int] = defaultdict(int)
        by_tier: dict[str, int] = defaultdict(int)
        calls: dict[str, int] = defaultdict(int)
        pending = 0
        for r in records:
            if not (r.resolve(block) if resolve else not r.pending):
                pending += 1
            elif not r.pending:
                seconds[r.op] += r.seconds
            by_op[r.op] += r.bytes_sent
            by_tier[_tier_key(r.tier)] += r.bytes_sent
            calls[r.op] += 1
        return {
            "bytes_by_tier": dict(by_tier),
            "bytes_by_op": dict(by_op),
            "seconds_by_op": dict(seconds),
            "calls_by_op": dict(calls),
            "bytes": sum(by_op.values()),
            "seconds": sum(seconds.values()),
            "calls": len(records),
            "pending": pending,
        }

    def step_summary(self, *, block: bool = True) -> dict:
        """Totals of the records since the last :meth:`mark_step` (the step in progress)."""
        return self.summarize(self._records[self._step_start :], block=block)

    def mark_step(self) -> dict:
        """Close the current step: return its summary and start counting the next one.

        Never waits and touches no event (see the note): the seconds cover the records whose times were
        already resolved (all of them on CPU), ``pending`` counts the others."""
        summary = self.summarize(self._records[self._step_start :], resolve=False)
        self._step_starts.append(self._step_start)
        self._step_start = len(self._records)
        self.steps_marked += 1
        if self.keep_steps is not None and len(self._step_starts) > self.keep_steps:
            drop = self._step_starts[len(self._step_starts) - self.keep_steps]
            del self._records[:drop]
            self._step_starts = [i - drop for i in self._step_starts[-self.keep_steps :]]
            self._step_start -= drop
        return summary

    def reset(self) -> None:
        """Forget every record and total."""
        self._records.clear()
        self._step_starts.clear()
        self._step_start = 0
        for totals in (self._tier_all, self._tier_no_scalar, self._op_tier):
            totals.clear()
        self.steps_marked = 0
