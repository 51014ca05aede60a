"""Instrumented collectives on mesh groups: all-gather, reduce-scatter, all-reduce, all-to-all, broadcast.

Each function takes a :class:`~zerotopo.comm.mesh.GroupHandle` and works in group *positions*
(topological order; see the mesh's [Note: group order]). The mesh numbers every process group by
position, so the collectives pass buffers straight through; only a group that torch numbered otherwise
(``not group.in_order``) takes the permuting path, with index tensors made once per group, records one
:class:`~zerotopo.comm.ledger.Record` into ``ledger`` when given, and runs synchronously (returns None)
or asynchronously (returns a :class:`Pending`). One code path serves NCCL, RCCL and gloo.

[Note: streams] With ``stream`` on an accelerator the collective is issued inside
``torch.cuda.stream(stream)``, so it starts after the work already queued there. ``Pending.wait(s)``
calls ``work.wait()`` while ``s`` is current: only then may an event recorded on ``s`` stand for the
collective's result (docs/engine.md, "Synchronization", rule 2). On CPU streams are ignored and ``wait``
blocks.

[Note: gloo fallbacks] Older gloo builds lack ``reduce_scatter`` and reductions of bf16/fp16. When the
backend refuses an op, the call is redone another way and remembered: non-reducing ops move the bytes
(a uint8 view); reductions run in fp32 (reduce-scatter as an fp32 all-reduce and
a slice). The ledger still records the logical message: its dtype and the ring bytes of
:mod:`zerotopo.placement.volume`, whatever the fallback moved.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.distributed as dist
from torch.profiler import record_function

from zerotopo.comm.ledger import Ledger, Record
from zerotopo.placement import volume

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
# One collective API name across torch versions (the *_single names replace the older ones).
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

Finish = Callable[[], None]
Observer = Callable[[str, Any, int, int], "Callable[[], None] | None"]

# instrumentation (observe_collectives): one observer per process, and whether this thread is issuing
_observer: Observer | None = None
_issuing = threading.local()


def observe_collectives(fn: Observer | None) -> Observer | None:
    """Call ``fn(op, process_group, numel, itemsize)`` before each collective the engine issues (``op`` as
    the ledger names it; the whole message: gathered output, reduce-scatter input, all-reduce buffer,
    all-to-all input, its elements and their width in bytes; a quantized collective's as the bytes of its
    codes and scales, itemsize 1), whichever torch.distributed calls carry it (a ring of
    point-to-point sends included). ``fn`` may return a callable: it is called on the issuing thread once
    the collective is issued (before anything waits for it). Returns the previous observer; None removes
    it. For instrumentation such as ``zerotopo_lab.bench.replay``, whose wrappers of torch.distributed
    skip the calls made while the engine issues one of its own (:func:`issuing`)."""
    global _observer
    previous, _observer = _observer, fn
    return previous


def issuing() -> bool:
    """Whether this thread is inside the issue of an engine collective (its torch.distributed calls are
    parts of that collective, already reported to the observer)."""
    return getattr(_issuing, "depth", 0) > 0


class RunOptions(TypedDict, total=False):
    """How a collective runs; every collective here takes these keywords (all optional).

    ``ledger``: record the call there (default: no record). ``async_op``: return a :class:`Pending`
    instead of waiting (default False). ``stream``: the accelerator stream to issue on (default: the
    current one; [Note: streams]). ``tag``: the name the record and the profiler range carry (default "").
    """

    ledger: Ledger | None
    async_op: bool
    stream: Any
    tag: str


def _looks_unsupported(exc: BaseException) -> bool:
    msg = str(exc).lower()
    keys = ("not supported", "unsupported", "not implemented", "does not support", "invalid scalar type")
    return any(s in msg for s in keys)


def _native_or_fallback(
    group: Any, op: str, dtype: torch.dtype, native: Callable[[], Any], fallback: Callable[[], Any]
) -> Any:
    """Run ``native``; on gloo, when it is (or was once) refused as unsupported, run ``fallback``."""
    backend = str(dist.get_backend(group.pg))
    if group.comm.refused(backend, op, dtype):
        return fallback()
    try:
        return native()
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        # Only a deterministic refusal may switch paths: every rank hits it alike, so all take the fallback.
        if backend != "gloo" or not _looks_unsupported(exc):
            raise
        group.comm.unsupported.add((backend, op, dtype))
        return fallback()


# -- pending work and timing ------------------------------------------------------------------------


def stream_context(stream: Any, device: torch.device | None = None) -> Any:
    """``torch.cuda.stream(stream)`` on an accelerator when a stream is given; nothing otherwise (CPU
    ranks have no streams: ``stream`` is None there, or ``device`` says the tensors live on the host)."""
    if stream is not None and (device is None or device.type == "cuda"):
        return torch.cuda.stream(stream)
    return contextlib.nullcontext()


def use_on_current_stream(*tensors: torch.Tensor) -> None:
    """Mark staging buffers as read by the current stream, so the caching allocator does not hand their
    memory out again (to the stream that allocated them) before that read is done."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


class Pending:
    """An asynchronous collective in flight; :meth:`wait` completes it (idempotent)."""

    def __init__(
        self, work: Any, finish: list[Finish], device: torch.device, record: Record | None, start: Any
    ):
        self._work = work
        self._finish = finish
        self._device = device
        self._record = record
        self._start = start
        self._done = False

    def wait(self, stream: Any = None) -> None:
        """Order the result before later work on ``stream`` (default: the current stream); on CPU, block
        until it arrived. Staged copies back into the caller's buffers run on that stream too."""
        if self._done:
            return
        with stream_context(stream, self._device):
            if self._work is not None:
                self._work.wait()
            for f in self._finish:
                f()
            if self._record is not None:
                if self._device.type == "cuda":
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    self._record.timing = (self._start, end)
                else:
                    self._record.seconds = time.perf_counter() - self._start
        self._done = True

    def is_completed(self) -> bool:
        """Whether :meth:`wait` ran, or the backend reports the transfer finished."""
        return self._done or self._work is None or bool(self._work.is_completed())


def _start_clock(device: torch.device) -> Any:
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def run_collective(
    op: str,
    group: Any,
    ref: torch.Tensor,
    *,
    numel: int,
    nbytes: int,
    dtype: torch.dtype | str,
    issue: Callable[[], tuple[Any, list[Finish]]],
    ledger: Ledger | None = None,
    tag: str = "",
    async_op: bool = False,
    stream: Any = None,
    wire_message_bytes: int | None = None,
) -> Pending | None:
    """Issue one collective (on ``stream``), record it, and wait unless ``async_op``.
    ``wire_message_bytes``: the whole message as it goes on the wire when that is not ``numel`` values
    of ``ref``'s width (a quantized collective's codes and scales); the observer is told it as bytes."""
    device = ref.device
    with stream_context(stream, device), record_function(f"zerotopo::{op} {tag}".rstrip()):
        start = _start_clock(device) if ledger is not None else None  # no events when nothing records
        issued = None
        if _observer is not None:
            n, width = (numel, ref.element_size()) if wire_message_bytes is None else (wire_message_bytes, 1)
            issued = _observer(op, getattr(group, "pg", None), n, width)
        _issuing.depth = getattr(_issuing, "depth", 0) + 1
        try:
            work, finish = issue()
        finally:
            _issuing.depth -= 1
        if issued is not None:
            issued()
    rec = None
    if ledger is not None:
        rec = ledger.record(op, group, dtype=dtype, numel=numel, bytes_sent=nbytes, seconds=0.0, tag=tag)
    pending = Pending(work, finish, device, rec, start)
    if async_op:
        return pending
    pending.wait(stream)
    return None


# -- helpers ----------------------------------------------------------------------------------------


def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    return t.view(-1)


def _check_split(big: torch.Tensor, small: torch.Tensor, d: int, op: str) -> None:
    if big.numel() != small.numel() * d:
        raise ValueError(
            f"{op}: the full buffer has {big.numel()} elements but the shard has {small.numel()} "
            f"and the group {d} ranks; expected {small.numel() * d}"
        )
    if big.dtype != small.dtype:
        raise ValueError(f"{op}: dtypes differ ({big.dtype} and {small.dtype})")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat tensor (every backend moves uint8)."""
    return t.view(torch.uint8)


def _unpermute(out_f: torch.Tensor, recv: torch.Tensor, idx: torch.Tensor, d: int) -> None:
    """Row ``i`` of ``out`` = row ``idx[i]`` of the staging buffer (pg-rank order -> position order)."""
    use_on_current_stream(recv, idx)
    out_f.view(d, -1).copy_(recv.view(d, -1).index_select(0, idx))


def _in_order(group: Any) -> bool:
    return bool(getattr(group, "in_order", group.pg_ranks == tuple(range(group.size))))


def _issue_into(
    group: Any,
    op: str,
    out_f: torch.Tensor,
    in_order: bool,
    native: Callable[[torch.Tensor], Any],
    fallback: Callable[[torch.Tensor], Any],
) -> tuple[Any, list[Finish]]:
    """Issue a collective whose chunk ``j`` of the received buffer comes from pg rank ``j``: straight into
    ``out_f`` when the group is in order, else into a staging buffer put in position order on finish."""
    recv = out_f if in_order else torch.empty_like(out_f)
    finish: list[Finish] = []
    if not in_order:
        idx = group.index(group.pg_ranks, out_f.device)
        finish.append(lambda: _unpermute(out_f, recv, idx, group.size))
    return _native_or_fallback(group, op, out_f.dtype, lambda: native(recv), lambda: fallback(recv)), finish


# -- the collectives --------------------------------------------------------------------------------


def issue_all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> tuple[Any, list[Finish]]:
    """Gather ``inp`` of every position into ``out`` (flat), position order. Shared with qcollectives."""
    out_f, inp_f = _flat(out, "all_gather output"), _flat(inp, "all_gather input")
    if group.size == 1:
        out_f.copy_(inp_f)
        return None, []
    d = group.size

    def native(recv: torch.Tensor) -> Any:
        return ALL_GATHER(recv, inp_f, group=group.pg, async_op=True)

    def fallback(recv: torch.Tensor) -> Any:
        return dist.all_gather(
            list(_bits(recv).view(d, -1).unbind(0)), _bits(inp_f), group=group.pg, async_op=True
        )

    return _issue_into(group, "all_gather", out_f, _in_order(group), native, fallback)


def all_gather(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    **options: Unpack[RunOptions],
) -> Pending | None:
    """``out`` = concatenation of every position's ``inp``, in position order."""
    _check_split(out, inp, group.size, "all_gather")
    nbytes = volume.all_gather_bytes(out.numel(), group.size, out.element_size())
    return run_collective(
        "all_gather", group, out, numel=out.numel(), nbytes=nbytes, dtype=out.dtype,
        issue=lambda: issue_all_gather(out, inp, group), **options,
    )  # fmt: skip


def reduce_scatter(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    *,
    order: Sequence[int] | None = None,
    op: str = "sum",
    **options: Unpack[RunOptions],
) -> Pending | None:
    """Reduce ``inp`` (the full buffer, natural chunk order) over the group; position ``i`` receives
    chunk ``order[i]`` (default ``i``) of the reduction in ``out``."""
    d = group.size
    _check_split(inp, out, d, "reduce_scatter")
    order = tuple(order) if order is not None else tuple(range(d))
    if sorted(order) != list(range(d)):
        raise ValueError(f"reduce_scatter: order {order} is not a permutation of the {d} positions")
    red = _REDUCE_OPS[op]
    nbytes = volume.reduce_scatter_bytes(inp.numel(), d, inp.element_size())

    def issue() -> tuple[Any, list[Finish]]:
        out_f, inp2 = _flat(out, "reduce_scatter output"), _flat(inp, "reduce_scatter input").view(d, -1)
        if d == 1:
            out_f.copy_(inp2[order[0]])
            return None, []
        # Block j of the staged input goes to pg rank j: the chunk its position must receive.
        src = tuple(order[p] for p in group.position_of_pg_rank)
        send = (
            inp2.view(-1)
            if src == tuple(range(d))
            else inp2.index_select(0, group.index(src, inp.device)).view(-1)
        )
        me = group.pg_ranks[group.position]

        def native() -> tuple[Any, list[Finish]]:
            # gloo moves host memory only: the ring is for CPU tensors (CUDA tensors take gloo's own path).
            if op == "sum" and send.device.type == "cpu" and str(dist.get_backend(group.pg)) == "gloo":
                _ring_reduce_scatter(out_f, send, group, owned=send.data_ptr() != inp2.data_ptr())
                return None, []
            return REDUCE_SCATTER(out_f, send, op=red, group=group.pg, async_op=True), []

        def fallback() -> tuple[Any, list[Finish]]:
            buf = send.to(torch.float32, copy=True)  # all_reduce works in place: never on the caller's input
            work = dist.all_reduce(buf, op=red, group=group.pg, async_op=True)

            def finish() -> None:
                use_on_current_stream(buf)
                out_f.copy_(buf.view(d, -1)[me])

            return work, [finish]

        return _native_or_fallback(group, "reduce_scatter", inp.dtype, native, fallback)

    return run_collective(
        "reduce_scatter", group, out, numel=inp.numel(), nbytes=nbytes, dtype=inp.dtype, issue=issue, **options
    )  # fmt: skip


def _ring_reduce_scatter(out_f: torch.Tensor, send: torch.Tensor, group: Any, *, owned: bool = False) -> None:
    """Sum-reduce-scatter as a ring of point-to-point steps; block ``j`` of ``send`` ends on pg rank ``j``.

    [Note: gloo reduce-scatter] gloo implements ``reduce_scatter`` as a full all-reduce, so every rank
    sends ``2(d-1)/d`` of the message instead of the ring's ``(d-1)/d`` (measured on the emulated
    network: 7.4 MB instead of 3.7 MB out of a node for a 4 MB message over 8 ranks). On a slow
    inter-node link that doubles the gradient traffic, so on gloo the ring runs here: ``d-1`` steps, each
    sending one partially reduced block to the next pg rank and adding the one received from the previous.
    Two ranks too: gloo's all-reduce sends each of them the whole message, the ring half of it (the
    ``zerotopo`` plan's cross-node ``optim_scatter`` pairs sent twice their schedule's bytes across nodes
    before, ``tests/lab/bench/test_tier_bytes.py``).
    It runs to completion on the calling thread (on CPU a collective's wait blocks the host anyway).
    """
    d = group.size
    me = group.pg_ranks[group.position]
    # Global ranks in the order torch numbers the group (the positions, for the mesh's groups).
    members = [group.ranks[p] for p in group.position_of_pg_rank]
    nxt, prv = members[(me + 1) % d], members[(me - 1) % d]
    # Partial sums accumulate in place: in the staged copy when there is one, else in a copy of the input.
    acc = send.view(d, -1) if owned else send.view(d, -1).clone()
    recv = torch.empty_like(acc[0])
    for k in range(d - 1):
        s_idx, r_idx = (me - k - 1) % d, (me - k - 2) % d
        ops = [
            dist.P2POp(dist.isend, acc[s_idx], nxt, group=group.pg),
            dist.P2POp(dist.irecv, recv, prv, group=group.pg),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        acc[r_idx] += recv
    out_f.copy_(acc[me])


def all_reduce(
    t: torch.Tensor,
    group: Any,
    *,
    op: str = "sum",
    **options: Unpack[RunOptions],
) -> Pending | None:
    """Reduce ``t`` in place over the group (``sum``, ``max`` or ``min``)."""
    red = _REDUCE_OPS[op]
    nbytes = volume.all_reduce_bytes(t.numel(), group.size, t.element_size())

    def issue() -> tuple[Any, list[Finish]]:
        flat = _flat(t, "all_reduce tensor")
        if group.size == 1:
            return None, []

        def native() -> tuple[Any, list[Finish]]:
            return dist.all_reduce(flat, op=red, group=group.pg, async_op=True), []

        def fallback() -> tuple[Any, list[Finish]]:
            buf = flat.to(torch.float32, copy=True)
            return dist.all_reduce(buf, op=red, group=group.pg, async_op=True), [lambda: flat.copy_(buf)]

        return _native_or_fallback(group, "all_reduce", t.dtype, native, fallback)

    return run_collective(
        "all_reduce", group, t, numel=t.numel(), nbytes=nbytes, dtype=t.dtype, issue=issue, **options
    )  # fmt: skip


def issue_all_to_all(out: torch.Tensor, inp: torch.Tensor, group: Any) -> tuple[Any, list[Finish]]:
    """Chunk ``i`` of ``inp`` goes to position ``i``; chunk ``j`` of ``out`` comes from position ``j``."""
    d = group.size
    out_f, inp_f = _flat(out, "all_to_all output"), _flat(inp, "all_to_all input")
    if d == 1:
        out_f.copy_(inp_f)
        return None, []
    in_order = _in_order(group)
    send = (
        inp_f
        if in_order
        else inp_f.view(d, -1).index_select(0, group.index(group.position_of_pg_rank, inp.device)).view(-1)
    )

    def native(recv: torch.Tensor) -> Any:
        return dist.all_to_all_single(recv, send, group=group.pg, async_op=True)

    def fallback(recv: torch.Tensor) -> Any:
        return dist.all_to_all_single(_bits(recv), _bits(send), group=group.pg, async_op=True)

    return _issue_into(group, "all_to_all", out_f, in_order, native, fallback)


def all_to_all(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    **options: Unpack[RunOptions],
) -> Pending | None:
    """Equal-chunk all-to-all: position ``i`` receives chunk ``i`` of every position's ``inp``."""
    if out.numel() != inp.numel() or out.numel() % group.size or out.dtype != inp.dtype:
        raise ValueError(
            f"all_to_all: input ({inp.numel()} {inp.dtype}) and output ({out.numel()} {out.dtype}) must "
            f"match and split into {group.size} equal chunks"
        )
    nbytes = volume.all_to_all_bytes(inp.numel(), group.size, inp.element_size())
    return run_collective(
        "all_to_all", group, out, numel=inp.numel(), nbytes=nbytes, dtype=inp.dtype,
        issue=lambda: issue_all_to_all(out, inp, group), **options,
    )  # fmt: skip


def all_to_all_uneven(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: Sequence[int],
    in_splits: Sequence[int],
    group: Any,
    **options: Unpack[RunOptions],
) -> Pending | None:
    """All-to-all with a count per pair, no padding: ``inp`` is ``in_splits[j]`` elements for position
    ``j`` after one another (position order), ``out`` receives ``out_splits[j]`` elements from position
    ``j`` in the same way; position ``j``'s ``in_splits`` entry for this rank must equal this rank's
    ``out_splits[j]``. The ledger records the elements that leave this rank (its own chunk stays)."""
    d = group.size
    if len(out_splits) != d or len(in_splits) != d or min((*out_splits, *in_splits), default=0) < 0:
        raise ValueError(
            f"all_to_all_uneven: need one non-negative count per position of a group of {d}, got "
            f"{list(in_splits)} to send and {list(out_splits)} to receive"
        )
    if inp.numel() != sum(in_splits) or out.numel() != sum(out_splits) or out.dtype != inp.dtype:
        raise ValueError(
            f"all_to_all_uneven: input ({inp.numel()} {inp.dtype}) and output ({out.numel()} {out.dtype}) "
            f"must hold the {sum(in_splits)} and {sum(out_splits)} elements the counts name, in one dtype"
        )
    sent = sum(n for j, n in enumerate(in_splits) if j != group.position)
    return run_collective(
        "all_to_all", group, out, numel=inp.numel(), nbytes=sent * inp.element_size(), dtype=inp.dtype,
        issue=lambda: _issue_all_to_all_uneven(out, inp, list(out_splits), list(in_splits), group),
        **options,
    )  # fmt: skip


def _issue_all_to_all_uneven(
    out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
) -> tuple[Any, list[Finish]]:
    """torch's ``all_to_all_single`` with split sizes (gloo has it); a group that torch numbers otherwise
    than by position sends and receives its chunks in torch's order, put back in position order on finish."""
    out_f, inp_f = _flat(out, "all_to_all output"), _flat(inp, "all_to_all input")
    if group.size == 1:
        out_f.copy_(inp_f)
        return None, []
    if _in_order(group):
        send, recv, finish = inp_f, out_f, []
        o_pg, i_pg = out_splits, in_splits
    else:
        by_pg = sorted(range(group.size), key=lambda p: group.pg_ranks[p])  # positions in torch's order
        chunks = inp_f.split(in_splits)
        send = torch.cat([chunks[p] for p in by_pg])
        o_pg, i_pg = [out_splits[p] for p in by_pg], [in_splits[p] for p in by_pg]
        recv = torch.empty_like(out_f)

        def unpermute() -> None:
            pieces = dict(zip(by_pg, recv.split(o_pg)))
            torch.cat([pieces[p] for p in range(group.size)], out=out_f)

        finish = [unpermute]

    def native() -> Any:
        return dist.all_to_all_single(recv, send, o_pg, i_pg, group=group.pg, async_op=True)

    def fallback() -> Any:
        w = send.element_size()
        return dist.all_to_all_single(
            _bits(recv), _bits(send), [n * w for n in o_pg], [n * w for n in i_pg], group=group.pg,
            async_op=True,
        )  # fmt: skip

    return _native_or_fallback(group, "all_to_all", out_f.dtype, native, fallback), finish


def broadcast(
    t: torch.Tensor,
    src_position: int,
    group: Any,
    **options: Unpack[RunOptions],
) -> Pending | None:
    """Copy ``t`` of position ``src_position`` into ``t`` of every member."""
    if not 0 <= src_position < group.size:
        raise ValueError(f"broadcast: source position {src_position} outside a group of {group.size}")
    nbytes = volume.broadcast_bytes(
        t.numel(), group.size, t.element_size(), is_root=group.position == src_position
    )

    def issue() -> tuple[Any, list[Finish]]:
        flat = _flat(t, "broadcast tensor")
        if group.size == 1:
            return None, []
        src = group.ranks[src_position]

        def native() -> Any:
            return dist.broadcast(flat, src=src, group=group.pg, async_op=True)

        def fallback() -> Any:
            return dist.broadcast(_bits(flat), src=src, group=group.pg, async_op=True)

        return _native_or_fallback(group, "broadcast", t.dtype, native, fallback), []

    return run_collective(
        "broadcast", group, t, numel=t.numel(), nbytes=nbytes, dtype=t.dtype, issue=issue, **options
    )  # fmt: skip


# -- reduction chains ----------------------------------------------------------------------------------

Reduction = Callable[[torch.Tensor], torch.Tensor]


def _scatter_step(group: Any, order: Sequence[int], ledger: Ledger | None, tag: str) -> Reduction:
    def step(buf: torch.Tensor) -> torch.Tensor:
        chunk = torch.empty(buf.numel() // group.size, dtype=buf.dtype, device=buf.device)
        reduce_scatter(chunk, buf, group, order=order, ledger=ledger, tag=tag)
        return chunk

    return step


def _all_reduce_step(group: Any, order: Sequence[int], ledger: Ledger | None, tag: str) -> Reduction:
    def step(buf: torch.Tensor) -> torch.Tensor:
        all_reduce(buf, group, ledger=ledger, tag=tag)
        return buf

    return step


_REDUCTION_STEPS: dict[str, Callable[[Any, Sequence[int], Ledger | None, str], Reduction]] = {
    "reduce_scatter": _scatter_step,
    "all_reduce": _all_reduce_step,
}


def reduction_step(
    op: str, group: Any, *, order: Sequence[int], ledger: Ledger | None, tag: str
) -> Reduction:
    """One link of a chain of sum reductions named by its ledger ``op``: ``reduce_scatter`` returns this
    position's chunk (``order`` places the chunks) in a new buffer, ``all_reduce`` sums the buffer in place
    and returns it. Built once; called with the buffer the previous link returned."""
    if op not in _REDUCTION_STEPS:
        raise ValueError(f"no reduction step for op {op!r}; known: {', '.join(_REDUCTION_STEPS)}")
    return _REDUCTION_STEPS[op](group, order, ledger, tag)
