"""Predicted step time: each collective on its measured bandwidth, NeoX FLOPs, and a two-stream overlap.

[Note: collective time] A call takes ``bytes_sent / busbw`` where ``busbw`` comes from the bandwidth
table (:mod:`zerotopo.cost.bandwidth`: by collective, message size and group span, interpolated in log
size); without a curve for it, the alpha-beta model of papers/004 §IV-A on the tier crossed:
``steps·latency(T) + bytes_sent / bandwidth(T)`` with ``steps = d-1`` (``2(d-1)`` for an all-reduce).
Across nodes ``bandwidth`` is the node's injection bandwidth shared by the groups that leave it: a group
with ``r`` ranks per node gets ``r/dpn`` of it per rank (a ring leaves each node once per group; the
Frontier curves show it: 71 GB/s bus bandwidth across 2 nodes of 8 ranks against 100 GB/s injection).

[Note: overlap] Compute is ``ModelShape.step_flops`` at ``peak × efficiency``, split over the units by
their FLOPs (the backward is 2× the forward, 3× with activation recomputation). One micro-batch is
simulated unit by unit on three streams — compute, gathers, reductions (one shared communication stream
when :attr:`OverlapModel.concurrent` is 1):

- a unit's gathers are issued when the compute ``prefetch`` units earlier starts (DeepSpeed: while the
  elements in flight stay under its prefetch bucket), or on demand; its compute starts when they end;
- its reductions are issued when its backward compute ends; the backward ends when they all have;
- two collectives in flight together on the same tier share its links: the later one takes longer by
  the time they overlap (the bandwidth curves are measured one collective at a time);
- compute that starts while a collective is in flight runs slower by
  :attr:`OverlapModel.compute_slowdown` over the overlapping time (communication kernels take compute
  units);
- the block quantizer is compute: a quantized collective's quantizer time (:func:`quantizer_time`)
  lengthens its stream's call *and* the next compute (CPU ranks quantize on the calling thread, a
  device on the SMs its kernels share with the compute), counted in the slowdown;
- micro-batches follow each other; in the last one a unit's cross-replica reduction (its
  ``last_reduce``, when the schedule runs it in the backward) is issued when its reduction ends, on a
  third stream when :attr:`OverlapModel.concurrent` is 3 or more, else after it on the reduction
  stream; the backward ends when they all have;
- in the first micro-batch each sharded unit's post-step parameter all-gather (its ``first_forward``,
  when the engine leaves it in flight into the next step) is issued at the start, in unit order, on
  the same stream as the last micro-batch's reductions, and the unit's forward gather is issued no
  earlier than its end;
- the step-end collectives (the scalars, and the post-step all-gather and cross-replica reduction when
  the schedule does not move them into the micro-batches) run after the last backward, serialised, and hide only
  :attr:`OverlapModel.step_end_overlap` of their time.

Each collective's time is split into the part hidden under compute and the exposed part (the compute
stream idle while it runs, shared equally between collectives in flight together).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zerotopo.cost.bandwidth import BandwidthTable
from zerotopo.errors import ConfigError
from zerotopo.placement import volume
from zerotopo.placement.schedule import Collective, StepSchedule
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology


@dataclass(frozen=True)
class OverlapModel:
    """Measurable overlap parameters (``zerotopo calibrate`` writes them; defaults documented)."""

    compute_slowdown: float = 0.189
    """Fractional slowdown of compute while a collective runs. Default: the mean slowdown measured over
    GPT and LLaMA layers on A100, H100, MI250 and MI210 (arXiv:2507.03114, "Characterizing
    Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning": 18.9% mean, 40% max)."""
    concurrent: int = 2
    """Collectives in flight at once: 2 = a gather stream and a reduction stream (the engine and
    DeepSpeed's ``overlap_comm``); 1 = one communication stream; 3 = the engine's step-end reduction
    stream beside them too. ROCm exposes 4 hardware queues by default (``GPU_MAX_HW_QUEUES``), so
    compute plus two communication streams fit."""
    step_end_overlap: float = 0.0
    """Fraction of the step-end collectives hidden behind the last backward (0: never, as the engine and
    DeepSpeed run them after the backward)."""
    host_reduce: bool = False
    """The per-micro-batch gradient reductions run on the thread that computes, so the backward waits for
    each (the engine and DeepSpeed on CPU ranks, where there is no side stream); False: on a side stream
    beside the compute (GPUs)."""

    def __post_init__(self) -> None:
        if not 0 <= self.compute_slowdown <= 10:
            raise ValueError(f"compute_slowdown must be in [0, 10], got {self.compute_slowdown!r}")
        if not isinstance(self.concurrent, int) or self.concurrent < 1:
            raise ValueError(f"concurrent must be an integer >= 1, got {self.concurrent!r}")
        if not 0 <= self.step_end_overlap <= 1:
            raise ValueError(f"step_end_overlap must be in [0, 1], got {self.step_end_overlap!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute_slowdown": self.compute_slowdown,
            "concurrent": self.concurrent,
            "step_end_overlap": self.step_end_overlap,
            "host_reduce": self.host_reduce,
        }


def overlap_from_mapping(raw: Any, source: str = "<overlap>", key: str = "overlap") -> OverlapModel:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"expected a mapping, found {raw!r}", source=source, key=key)
    allowed = ("compute_slowdown", "concurrent", "step_end_overlap", "host_reduce")
    for k in raw:
        if k not in allowed:
            raise ConfigError(f"unknown key; expected {', '.join(allowed)}", source=source, key=f"{key}.{k}")
    try:
        return OverlapModel(**dict(raw))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), source=source, key=key) from None


@dataclass(frozen=True)
class TimeShare:
    """Where the seconds of one kind of collective go in a step."""

    phase: str
    op: str
    group: str
    tier: str
    calls: int
    seconds: float
    """All its calls as the simulation ran them (longer than alone when sharing links)."""
    exposed_s: float
    """Part of the step the compute stream waited on it."""

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.seconds - self.exposed_s)


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step and the rates that follow from it."""

    step_time_s: float
    compute_s: float
    """Compute of all micro-batches at ``peak × efficiency`` (without the slowdown)."""
    comm_s: float
    """All communication if nothing overlapped (each collective alone on its links)."""
    exposed_comm_s: float
    """Step time not spent computing: communication the compute waited on."""
    tokens_per_s: float
    """Tokens per second of the whole job."""
    tflops_per_device: float
    """Hardware TFLOPS per device (recomputed forward counted, as NeoX logs it)."""
    mfu: float
    """Model FLOPs (forward + backward, no recompute) over peak; 0 when the peak is unknown."""
    slowdown_s: float = 0.0
    """Compute time added by collectives running alongside it."""
    breakdown: tuple[TimeShare, ...] = field(default=(), repr=False)
    """Per (phase, op, group, tier): seconds and exposed seconds."""


def quantizer_time(c: Collective, topology: Topology) -> float:
    """Seconds the block quantizer takes in one call of ``c`` on one rank: at the device's measured
    ``quant_gbps`` when the topology gives one, else the kernels' bytes moved (:func:`quantizer_bytes`)
    at its ``memory_bandwidth_gbps`` (a roofline); 0 for plain codecs or when neither is known."""
    dev = topology.device
    if not c.quant_numel:
        return 0.0
    if dev.quant_gbps > 0:
        return c.quant_numel * 4 / (dev.quant_gbps * 1e9)
    if dev.memory_bandwidth_gbps > 0:
        return quantizer_bytes(c) / (dev.memory_bandwidth_gbps * 1e9)
    return 0.0


def quantizer_bytes(c: Collective, value_bytes: int = 4) -> float:
    """Device-memory bytes the Triton quantizer kernels move in one call of ``c``, for values of
    ``value_bytes`` (fp32 by default: the schedule does not carry the parameters' type; bf16 moves less).

    int8 gather over ``d`` ranks (``quant_numel = n + n/d``; a whole-unit secondary has ``d = 1``):
    quantize this rank's ``n/d`` values, dequantize the gathered ``n``. int4 reduce-scatter hop over
    ``d`` ranks (``quant_numel = 2n``): quantize the ``n`` values, then one fused dequantize-and-sum of
    the ``n`` received into ``n/d`` fp32 sums. ``message_bytes`` is the ``n`` values' payload."""
    d, payload = c.group_size, c.message_bytes
    if c.dtype == "int4":
        n = c.quant_numel // 2
        return volume.quantize_traffic(n, payload, value_bytes) + volume.dequantize_reduce_traffic(
            n, d, payload
        )
    n = c.quant_numel * d // (d + 1)
    mine = volume.quantize_traffic(n // d, payload // d, value_bytes)  # this rank's share of the message
    return mine + volume.dequantize_traffic(n, payload, value_bytes)


def collective_time(c: Collective, topology: Topology, table: BandwidthTable | None = None) -> float:
    """Seconds of one call of ``c``: the table's bus bandwidth, else alpha-beta on its tier, plus the
    quantizer's passes (:func:`quantizer_time`)."""
    return _wire_time(c, topology, table) + quantizer_time(c, topology)


def _wire_time(c: Collective, topology: Topology, table: BandwidthTable | None) -> float:
    if c.bytes_sent == 0:  # a local pass (the quantizer of a one-rank group): nothing on the wire
        return 0.0
    if table is not None and c.message_bytes > 0 and c.tier:
        rpn = c.ranks_per_node or c.group_size
        bw = table.busbw(c.op, c.message_bytes, c.tier, c.nodes, rpn)
        if bw:
            return c.bytes_sent / (bw * 1e9)
    bw = topology.bandwidth_gbps(c.tier) * 1e9
    if c.tier == topology.network.name and c.ranks_per_node > 1:
        # a ring leaves each node once per group: with r of a node's ranks in each group, the node's
        # injection bandwidth is shared by dpn/r groups, not by its dpn devices
        bw *= min(c.ranks_per_node, topology.devices_per_node)
    return c.latency_steps * topology.latency_us(c.tier) * 1e-6 + c.bytes_sent / bw


def _key(c: Collective) -> tuple[str, str, str, str]:
    return (c.phase, c.op, c.group, c.tier)


def _simulate(
    schedule: StepSchedule,
    fwd: list[float],
    bwd: list[float],
    time_of,
    overlap: OverlapModel,
    first: bool,
    last: bool,
    quant_of=lambda c: 0.0,
):
    """One micro-batch (see the module note; ``first``: the step's first, with the units'
    ``first_forward``; ``last``: its last, with their ``last_reduce``): (end, slowdown, comm intervals,
    compute intervals)."""
    units = schedule.units
    U = len(units)
    free = {"gather": 0.0, "reduce": 0.0, "replica": 0.0}
    streams = {
        1: {"gather": "gather", "reduce": "gather", "replica": "gather"},
        2: {"gather": "gather", "reduce": "reduce", "replica": "reduce"},
    }.get(overlap.concurrent, {"gather": "gather", "reduce": "reduce", "replica": "replica"})
    stream = streams.__getitem__
    comm: list[tuple[float, float, Collective]] = []
    busy: list[tuple[float, float]] = []
    slow = 0.0
    t = 0.0
    debt = 0.0  # quantizer seconds the compute stream still owes (see collective time)

    tier_of: dict[str, str] = {}

    def run(kind: str, at: float, colls) -> float:
        if not colls:  # nothing to move: ready at once, the stream stays as it is
            return at
        s = stream(kind)
        start = max(at, free[s])
        nonlocal debt
        for c in colls:
            d = time_of(c)
            debt += quant_of(c)  # the quantizer is compute: it takes the cores/SMs the compute runs on
            # the other stream busy on the same tier: the two share its links while both run
            for o, until in free.items():
                if o != s and until > start and tier_of.get(o) == c.tier:
                    d += min(d, until - start)
            comm.append((start, start + d, c))
            start += d
            tier_of[s] = c.tier
        free[s] = start
        return start

    def compute(start: float, dur: float) -> float:
        nonlocal slow, debt
        inflight = max(0.0, max(free.values()) - start)
        extra = overlap.compute_slowdown * min(dur, inflight) + debt
        debt = 0.0
        slow += extra
        busy.append((start, start + dur + extra))
        return start + dur + extra

    # the previous step's parameter all-gathers, in flight from the start (the first micro-batch only)
    params_at = [run("replica", 0.0, u.first_forward) if first else 0.0 for u in units]
    for direction in ("forward", "backward"):
        order = list(range(U)) if direction == "forward" else list(range(U - 1, -1, -1))
        not_before = params_at if direction == "forward" else [0.0] * U
        ready = [0.0] * U
        issued = 0
        for pos, i in enumerate(order):
            u = units[i]
            while issued <= pos:  # on demand: when the previous compute ends
                j = order[issued]
                colls = units[j].forward if direction == "forward" else units[j].backward
                ready[j] = run("gather", max(t, not_before[j]), colls)
                issued += 1
            start = max(t, ready[i])
            depth = u.prefetch if direction == "forward" else u.prefetch_backward
            while issued <= min(U - 1, pos + depth):
                j = order[issued]
                colls = units[j].forward if direction == "forward" else units[j].backward
                ready[j] = run("gather", max(start, not_before[j]), colls)
                issued += 1
            t = compute(start, fwd[i] if direction == "forward" else bwd[i])
            if direction == "backward" and (u.reduce or last and u.last_reduce):
                done = run("reduce", t, u.reduce)
                if overlap.host_reduce:
                    t = done  # the next backward compute starts when the reduction returns
                if last:
                    run("replica", done, u.last_reduce)
    t += debt  # the quantizer passes after the last compute (the last reductions')
    slow += debt
    end = max([t] + list(free.values()))
    return end, slow, comm, busy


def _exposure(comm, busy, end: float) -> dict[int, float]:
    """Exposed seconds per comm interval: compute-idle time shared among the collectives in flight."""
    gaps = []
    t = 0.0
    for s, e in sorted(busy):
        if s > t:
            gaps.append((t, s))
        t = max(t, e)
    if end > t:
        gaps.append((t, end))
    out: dict[int, float] = defaultdict(float)
    if not gaps or not comm:
        return out
    for gs, ge in gaps:
        inside = [(max(s, gs), min(e, ge), k) for k, (s, e, _) in enumerate(comm) if s < ge and e > gs]
        if not inside:
            continue
        points = sorted({gs, ge} | {x for a, b, _ in inside for x in (a, b)})
        for a, b in zip(points, points[1:]):
            active = [k for s, e, k in inside if s < b and e > a]
            for k in active:
                out[k] += (b - a) / len(active)
    return out


def step_time(
    schedule: StepSchedule,
    topology: Topology,
    shape: ModelShape,
    *,
    micro_batch: int,
    efficiency: float = 0.5,
    checkpoint_activations: bool = True,
    table: BandwidthTable | None = None,
    overlap: OverlapModel | None = None,
) -> StepTime:
    """Step time of ``schedule`` (see the module notes). A device with unknown peak (0 TFLOPS) is
    costed on communication alone."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    overlap = overlap or OverlapModel()
    if topology.device.host_reduce and not overlap.host_reduce:  # the machine says its ranks reduce so
        overlap = replace(overlap, host_reduce=True)
    M = schedule.micro_batches
    samples = micro_batch * M
    flops = shape.step_flops(samples, checkpoint_activations=checkpoint_activations)
    peak = topology.device.peak_tflops * 1e12
    compute = flops / (peak * efficiency) if peak > 0 else 0.0
    per_mb = compute / M
    fwd_share = 1.0 / (4.0 if checkpoint_activations else 3.0)
    weights = [u.unit.flops for u in schedule.units]
    total_w = sum(weights)
    if total_w <= 0:
        weights, total_w = [1.0] * len(schedule.units), float(len(schedule.units) or 1)
    fwd = [per_mb * fwd_share * w / total_w for w in weights]
    bwd = [per_mb * (1 - fwd_share) * w / total_w for w in weights]
    cache: dict[int, float] = {}  # by object: units of one size share their collectives

    def time_of(c: Collective) -> float:
        t = cache.get(id(c))
        if t is None:
            t = cache[id(c)] = collective_time(c, topology, table)
        return t

    def quant_of(c: Collective) -> float:
        return quantizer_time(c, topology)  # 0 for plain codecs

    # the middle micro-batches are alike; the first also waits for the units' first_forward, the last
    # runs their last_reduce
    has_first = any(u.first_forward for u in schedule.units)
    has_last = any(u.last_reduce for u in schedule.units)
    if M == 1:
        runs = [(1, has_first, has_last)]
    else:
        runs = [(1, has_first, False), (M - 2, False, False), (1, False, has_last)]
    by_obj: dict[int, list] = {}
    micro_time = slow_total = 0.0
    for weight, first, last in runs:
        if weight == 0:
            continue
        end, slow, comm, busy = _simulate(schedule, fwd, bwd, time_of, overlap, first, last, quant_of)
        micro_time += weight * end
        slow_total += weight * slow
        exposed = _exposure(comm, busy, end)
        for k, (s, e, c) in enumerate(comm):
            acc = by_obj.setdefault(id(c), [c, 0, 0.0, 0.0])
            acc[1] += weight
            acc[2] += (e - s) * weight
            acc[3] += exposed.get(k, 0.0) * weight
    shares: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for c, n, sec, exp in by_obj.values():
        acc = shares[_key(c)]
        acc[0] += n
        acc[1] += sec
        acc[2] += exp
    step_end = 0.0
    for c in schedule.step_end:
        d = time_of(c)
        step_end += d
        acc = shares[_key(c)]
        acc[0] += 1
        acc[1] += d
        acc[2] += d * (1 - overlap.step_end_overlap)
    last_bwd = sum(bwd)
    hidden_end = min(overlap.step_end_overlap * step_end, last_bwd)
    total = micro_time + step_end - hidden_end
    all_comm = (
        M * sum(time_of(c) for u in schedule.units for c in u.forward + u.backward + u.reduce)
        + sum(time_of(c) for u in schedule.units for c in u.last_reduce + u.first_forward)
        + step_end
    )
    tokens = samples * shape.seq_length * topology.world_size
    model_flops = shape.step_flops(samples, checkpoint_activations=False)
    breakdown = tuple(
        TimeShare(p, op, g, tier, int(v[0]), v[1], v[2]) for (p, op, g, tier), v in sorted(shares.items())
    )
    return StepTime(
        step_time_s=total,
        compute_s=compute,
        comm_s=all_comm,
        exposed_comm_s=max(0.0, total - compute - slow_total),
        tokens_per_s=tokens / total if total > 0 else 0.0,
        tflops_per_device=flops / total / 1e12 if total > 0 and peak > 0 else 0.0,
        mfu=model_flops / total / peak if total > 0 and peak > 0 else 0.0,
        slowdown_s=slow_total,
        breakdown=breakdown,
    )
