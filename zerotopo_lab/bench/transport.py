"""The processor time CPU ranks spend moving collectives, measured before ``bench compare``'s rows.

[Note: transport time] On CPU ranks the transport is the processor's work: gloo's threads copy the
message through the TCP stack, the calling thread runs the engine's ring steps and sums what it
receives. With more ranks than cores, every processor second a rank spends on it is taken from the
ranks' compute, which runs on the same cores. The cost model prices it as compute time lost per call
and per byte sent (``Device.comm_cpu_us_per_call``, ``Device.comm_cpu_us_per_mb``;
:func:`zerotopo.cost.time.transport_time`), so a schedule of many small calls pays for each call as
well as for its bytes.

:func:`probe` runs on every rank, on the links the rows will use: the engine's all-gather and
reduce-scatter and an all-reduce over the whole job, at two message sizes, a few calls each, and reads
each call's processor seconds (``time.process_time``: all the rank's threads). :func:`fit` takes the
median over ranks per call and fits ``cpu = per_call + per_byte * bytes_sent`` by least squares, then
scales both by the ranks sharing a core (``world / cores``, at least 1): the compute one rank loses.
A device whose transport runs beside the compute (GPUs: the NIC and the communication kernels, whose
interference is ``OverlapModel.compute_slowdown``) has neither figure.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

#: bf16 elements of the probe's messages: about a small DeepSpeed prefetch bucket and a layer's gather
SIZES = (1 << 17, 1 << 21)
CALLS = 3
"""Timed calls per op and size (after one untimed)."""


@dataclass(frozen=True)
class Transport:
    """Compute seconds one rank loses to the transport of its collectives."""

    per_call_s: float
    """Per collective call it makes."""
    per_byte_s: float
    """Per byte it sends."""
    ranks_per_core: float
    """Ranks sharing a core when measured (the factor the processor seconds were scaled by)."""
    samples: tuple[tuple[str, int, float], ...] = ()
    """(op, bytes one rank sent, median processor seconds over the ranks) of each probed call kind."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "us_per_call": round(self.per_call_s * 1e6, 1),
            "us_per_mb": round(self.per_byte_s * 1e12, 1),
            "ranks_per_core": self.ranks_per_core,
            "probe": [{"op": op, "bytes_sent": b, "cpu_s": round(s, 6)} for op, b, s in self.samples],
        }

    def device_fields(self) -> dict[str, float]:
        """The topology device's fields that carry it (:class:`zerotopo.placement.topology.Device`)."""
        return {"comm_cpu_us_per_call": self.per_call_s * 1e6, "comm_cpu_us_per_mb": self.per_byte_s * 1e12}


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def engine_ops(n: int, world: int, group: Any) -> dict[str, tuple[Callable[[], Any], int]]:
    """The engine's all-gather, reduce-scatter and all-reduce of one bf16 message of ``n`` elements (a
    multiple of ``world``) over ``group`` (a :class:`zerotopo.comm.mesh.GroupHandle` of ``world`` ranks):
    op -> (the call, bytes one rank sends per call)."""
    import torch

    from zerotopo.comm import collectives as C
    from zerotopo.placement import volume

    x = torch.ones(n, dtype=torch.bfloat16)
    shard, full = torch.empty(n // world, dtype=x.dtype), torch.empty(n, dtype=x.dtype)
    size = x.element_size()
    return {
        "all_gather": (partial(C.all_gather, full, x[: n // world], group), volume.all_gather_bytes(n, world, size)),
        "reduce_scatter": (partial(C.reduce_scatter, shard, x, group), volume.reduce_scatter_bytes(n, world, size)),
        "all_reduce": (partial(C.all_reduce, x, group), volume.all_reduce_bytes(n, world, size)),
    }  # fmt: skip


def probe(group: Any, world: int) -> list[tuple[str, int, float]]:
    """On every rank of ``group`` (the whole job, a :class:`zerotopo.comm.mesh.GroupHandle`): (op, bytes
    this rank sent per call, median processor seconds per call) for each op and size of the probe."""
    import torch.distributed as dist

    out = []
    for n in SIZES:
        for op, (call, sent) in engine_ops(n - n % world, world, group).items():
            cpu = []
            for i in range(CALLS + 1):
                dist.barrier()
                c0 = time.process_time()
                call()
                if i:
                    cpu.append(time.process_time() - c0)
            out.append((op, sent, statistics.median(cpu)))
    dist.barrier()
    return out


def fit(per_rank: list[list[tuple[str, int, float]]], world: int, n_cores: int | None = None) -> Transport:
    """:class:`Transport` from every rank's :func:`probe` (see the module note)."""
    if not per_rank or not per_rank[0]:
        raise ValueError("no probe samples to fit")
    samples = tuple(
        (op, sent, statistics.median(r[k][2] for r in per_rank))
        for k, (op, sent, _) in enumerate(per_rank[0])
    )
    xs = [float(s) for _, s, _ in samples]
    ys = [c for _, _, c in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    slope = max(0.0, slope)
    intercept = max(0.0, my - slope * mx)
    share = max(1.0, world / (n_cores or cores()))
    return Transport(intercept * share, slope * share, share, samples)
