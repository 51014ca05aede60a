"""Predicted step time: each collective on its measured bandwidth, NeoX FLOPs, and a two-stream overlap.

[Note: collective time] A call takes ``bytes_sent / busbw`` where ``busbw`` comes from the bandwidth
table (:mod:`zerotopo.cost.bandwidth`: by collective, message size and group span, interpolated in log
size); without a curve for it, the alpha-beta model of Chen et al., "Lins: Reducing Communication Overhead
of ZeRO for Efficient LLM Training" (IWQoS 2024, doi:10.1109/IWQoS61813.2024.10682856) §IV-A on the tier
crossed:
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
- on CPU ranks the transport is compute too: each call of a collective that overlaps the compute also
  lengthens the next compute by :func:`transport_time` (the device's measured processor time per call
  and per MB sent, :mod:`zerotopo_lab.bench.transport`; none on a GPU), counted in the slowdown;
- micro-batches follow each other; in the last one a unit's cross-replica reduction (its
  ``last_reduce``, when the schedule runs it in the backward) is issued when its reduction ends, on a
  third stream when :attr:`OverlapModel.concurrent` is 3 or more, else after it on the reduction
  stream; the backward ends when they all have;
- the first micro-batch's forward gathers are the units' ``first_micro_forward`` where they have one;
- in the first micro-batch each sharded unit's post-step parameter all-gather (its ``first_forward``,
  when the engine leaves it in flight into the next step) is issued at the start, in unit order, on
  the same stream as the last micro-batch's reductions, and the unit's forward gather is issued no
  earlier than its end;
- the step-end collectives (the scalars, and the post-step all-gather and cross-replica reduction when
  the schedule does not move them into the micro-batches) run after the last backward, serialised, and hide only
  :attr:`OverlapModel.step_end_overlap` of their time.

Each collective's time is split into the part hidden under compute and the exposed part (the compute
stream idle while it runs, shared equally between collectives in flight together).

[Note: beyond the bytes] The compute rate is ``peak × efficiency`` or a measured ``achieved_tflops``
(``zerotopo calibrate``'s ``device.compute_tflops``). The optimizer step after the step-end collectives
is memory traffic (:func:`optimizer_bytes` per element of the rank's shard over the device's
``memory_bandwidth_gbps``). A framework's fixed runtime costs (:class:`RuntimeCosts`: host work per
unit, a fetch window, a separate scales gather) are DeepSpeed stage 3's in its presets and none in the
engine (:mod:`zerotopo_lab.presets`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zerotopo.cost.bandwidth import BandwidthTable
from zerotopo.cost.quantrates import passes_time
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
    optimizer_s: float = 0.0
    """The optimizer step (unscale, clipping, AdamW) as memory traffic, after the step-end collectives."""
    host_s: float = 0.0
    """Compute time the framework's host work added (units whose host work outlasts their compute)."""


def quantizer_time(c: Collective, topology: Topology) -> float:
    """Seconds the block quantizer takes in one call of ``c`` on one rank, priced by the input dtype of
    its values (``c.value_bytes``) and by pass: at the device's measured rates for that dtype and code
    (``quant_rates``, :func:`zerotopo.cost.quantrates.passes_time`) when it has them, else at its
    measured ``quant_gbps`` (one rate of fp32 values for every pass), else the kernels' bytes moved
    (:func:`quantizer_bytes`, fp32 values) at its ``memory_bandwidth_gbps`` (a roofline); 0 for plain
    codecs or when none is known."""
    dev = topology.device
    if not c.quant_numel:
        return 0.0
    if dev.quant_rates:
        t = passes_time(dev.quant_rates, c.dtype, c.value_bytes, c.group_size, c.quant_numel)
        if t is not None:
            return t
    if dev.quant_gbps > 0:
        return c.quant_numel * 4 / (dev.quant_gbps * 1e9)
    if dev.memory_bandwidth_gbps > 0:
        return quantizer_bytes(c) / (dev.memory_bandwidth_gbps * 1e9)
    return 0.0


def device_overlap(overlap: OverlapModel, topology: Topology) -> OverlapModel:
    """``overlap`` as the device amends it: a device whose ranks reduce on the computing thread
    (``host_reduce``) says so; a device with transport figures (``comm_cpu_us_per_call`` or ``_per_mb``,
    CPU ranks) prices what the collectives take from the compute per call and per byte
    (:func:`transport_time`), in place of the slowdown per second in flight (a GPU's interference), so
    its ``compute_slowdown`` is 0."""
    dev = topology.device
    if dev.host_reduce and not overlap.host_reduce:
        overlap = replace(overlap, host_reduce=True)
    if (dev.comm_cpu_us_per_call or dev.comm_cpu_us_per_mb) and overlap.compute_slowdown:
        overlap = replace(overlap, compute_slowdown=0.0)
    return overlap


def transport_time(c: Collective, topology: Topology) -> float:
    """Compute seconds one rank loses to the transport of one call of ``c``: the device's
    ``comm_cpu_us_per_call`` plus ``comm_cpu_us_per_mb`` per MB the rank sends (CPU ranks, whose
    transport runs on the cores the compute runs on: :mod:`zerotopo_lab.bench.transport`); 0 on a device
    without them."""
    dev = topology.device
    return (dev.comm_cpu_us_per_call + dev.comm_cpu_us_per_mb * c.bytes_sent / 1e6) * 1e-6


def quantizer_bytes(c: Collective, value_bytes: int = 4) -> float:
    """Device-memory bytes the Triton quantizer kernels move in one call of ``c``, for values of
    ``value_bytes`` (fp32 by default, as :func:`quantizer_time`'s roofline prices every collective; a
    collective's own width is ``c.value_bytes``).

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


@dataclass(frozen=True)
class RuntimeCosts:
    """A framework runtime's fixed costs that its collectives' bytes do not show (see the module note);
    the engine has none, DeepSpeed stage 3's are :data:`zerotopo_lab.presets.DEEPSPEED_RUNTIME`."""

    host_s_per_unit: float = 0.0
    """Host seconds per unit per micro-batch (hooks, fetch and release, gradient hook): a third in the
    forward, two thirds in the backward; a unit's compute takes at least that long (the device waits
    for a host that falls behind)."""
    fetch_window: int | None = None
    """Units ahead whose gathers may be in flight (the host blocks on the oldest fetch beyond it);
    None: the schedule's prefetch depth alone."""
    scale_gather: bool = False
    """An int8 all-gather runs as two calls, the codes then their fp32 scales, each paying its own
    latency and its own place on the bandwidth curve."""

    def __post_init__(self) -> None:
        if not 0 <= self.host_s_per_unit < float("inf"):
            raise ValueError(
                f"host_s_per_unit must be a finite number of seconds >= 0, got {self.host_s_per_unit!r}"
            )
        if self.fetch_window is not None and self.fetch_window < 1:
            raise ValueError(f"fetch_window must be >= 1 or None, got {self.fetch_window!r}")


@dataclass(frozen=True)
class OptimizerShard:
    """What one rank's optimizer step touches: its shard of the parameters and their widths."""

    numel: int
    """Elements of the rank's optimizer shard (parameters / optimizer degree)."""
    grad_bytes: int = 4
    """Width of the accumulated gradient shard it reads."""
    param_bytes: int = 2
    """Width of the low-precision parameter copy it writes."""


def optimizer_bytes(grad_bytes: int, param_bytes: int) -> int:
    """Device-memory bytes per element of one AdamW step with gradient unscaling and clipping, each a
    pass over the shard (the kernels are memory-bound: a few FLOPs per byte):

    - the gradient norm for clipping (and the overflow check): read the gradient;
    - unscale and clip, fused into one multiply by the combined factor: read and write the gradient;
    - AdamW: read the gradient, the fp32 master, m and v (12 bytes), write the three back, write the
      low-precision parameter copy."""
    return grad_bytes + 2 * grad_bytes + (grad_bytes + 12) + 12 + param_bytes


def optimizer_time(shard: OptimizerShard, topology: Topology) -> float:
    """Seconds of one rank's optimizer step: :func:`optimizer_bytes` per element of its shard at the
    device's ``memory_bandwidth_gbps``; 0 when the topology does not declare it."""
    bw = topology.device.memory_bandwidth_gbps
    if bw <= 0 or shard.numel <= 0:
        return 0.0
    return shard.numel * optimizer_bytes(shard.grad_bytes, shard.param_bytes) / (bw * 1e9)


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


class _Streams:
    """The compute stream and the communication streams of one simulated micro-batch."""

    def __init__(self, overlap: OverlapModel, time_of: Callable[[Collective], float], debt_of) -> None:
        self.overlap = overlap
        self.time_of = time_of
        self.debt_of = debt_of
        self.free = {"gather": 0.0, "reduce": 0.0, "replica": 0.0}
        self.stream = {
            1: {"gather": "gather", "reduce": "gather", "replica": "gather"},
            2: {"gather": "gather", "reduce": "reduce", "replica": "reduce"},
        }.get(overlap.concurrent, {"gather": "gather", "reduce": "reduce", "replica": "replica"})
        self.comm: list[tuple[float, float, Collective]] = []
        self.busy: list[tuple[float, float]] = []
        self.slow = 0.0
        self.debt = 0.0  # quantizer and transport seconds the compute stream still owes (module note)
        self.tier_of: dict[str, str] = {}

    def run(self, kind: str, at: float, colls) -> float:
        """Issue ``colls`` on ``kind``'s stream no earlier than ``at``; returns when they end."""
        if not colls:  # nothing to move: ready at once, the stream stays as it is
            return at
        s = self.stream[kind]
        start = max(at, self.free[s])
        for c in colls:
            d = self.time_of(c)
            # the quantizer (and a CPU rank's transport) is compute: it takes the cores/SMs the compute runs on
            self.debt += self.debt_of(c)
            # the other stream busy on the same tier: the two share its links while both run
            for o, until in self.free.items():
                if o != s and until > start and self.tier_of.get(o) == c.tier:
                    d += min(d, until - start)
            self.comm.append((start, start + d, c))
            start += d
            self.tier_of[s] = c.tier
        self.free[s] = start
        return start

    def compute(self, start: float, dur: float) -> float:
        """Run ``dur`` seconds of compute from ``start``, slowed by the collectives in flight."""
        inflight = max(0.0, max(self.free.values()) - start)
        extra = self.overlap.compute_slowdown * min(dur, inflight) + self.debt
        self.debt = 0.0
        self.slow += extra
        self.busy.append((start, start + dur + extra))
        return start + dur + extra


def _pass(
    schedule: StepSchedule,
    st: _Streams,
    direction: str,
    durations: list[float],
    t: float,
    not_before,
    last,
    first: bool = False,
) -> float:
    """One direction of a micro-batch: gathers issued on demand or ``prefetch`` units ahead, then each
    unit's compute (and in the backward its reductions); returns when the last compute ends. ``first``:
    the step's first micro-batch (its units' ``first_micro_forward``)."""
    units = schedule.units
    U = len(units)
    order = list(range(U)) if direction == "forward" else list(range(U - 1, -1, -1))
    ready = [0.0] * U
    issued = 0

    def issue(upto: int, at: float) -> None:
        nonlocal issued
        while issued <= upto:
            j = order[issued]
            colls = units[j].forward_in(first) if direction == "forward" else units[j].backward
            ready[j] = st.run("gather", max(at, not_before[j]), colls)
            issued += 1

    for pos, i in enumerate(order):
        u = units[i]
        issue(pos, t)  # on demand: when the previous compute ends
        start = max(t, ready[i])
        issue(min(U - 1, pos + (u.prefetch if direction == "forward" else u.prefetch_backward)), start)
        t = st.compute(start, durations[i])
        if direction == "backward" and (u.reduce or last and u.last_reduce):
            done = st.run("reduce", t, u.reduce)
            if st.overlap.host_reduce:
                t = done  # the next backward compute starts when the reduction returns
            if last:
                st.run("replica", done, u.last_reduce)
    return t


def _simulate(
    schedule: StepSchedule,
    fwd: list[float],
    bwd: list[float],
    time_of,
    overlap: OverlapModel,
    first: bool,
    last: bool,
    debt_of=lambda c: 0.0,
):
    """One micro-batch (see the module note; ``first``: the step's first, with the units'
    ``first_forward``; ``last``: its last, with their ``last_reduce``): (end, slowdown, comm intervals,
    compute intervals)."""
    st = _Streams(overlap, time_of, debt_of)
    units = schedule.units
    # the previous step's parameter all-gathers, in flight from the start (the first micro-batch only)
    params_at = [st.run("replica", 0.0, u.first_forward) if first else 0.0 for u in units]
    t = _pass(schedule, st, "forward", fwd, 0.0, params_at, last, first)
    t = _pass(schedule, st, "backward", bwd, t, [0.0] * len(units), last)
    t += st.debt  # the quantizer passes after the last compute (the last reductions')
    st.slow += st.debt
    end = max([t] + list(st.free.values()))
    return end, st.slow, st.comm, st.busy


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


def _compute_split(
    schedule: StepSchedule, per_mb: float, checkpoint_activations: bool, runtime: RuntimeCosts
) -> tuple[list[float], list[float]]:
    """Forward and backward compute seconds of each unit in one micro-batch, split by the units' FLOPs;
    a unit's host work (``runtime.host_s_per_unit``) bounds it from below (the device waits for it)."""
    fwd_share = 1.0 / (4.0 if checkpoint_activations else 3.0)
    weights = [u.unit.flops for u in schedule.units]
    total_w = sum(weights)
    if total_w <= 0:
        weights, total_w = [1.0] * len(schedule.units), float(len(schedule.units) or 1)
    host = runtime.host_s_per_unit
    fwd = [max(per_mb * fwd_share * w / total_w, host / 3) for w in weights]
    bwd = [max(per_mb * (1 - fwd_share) * w / total_w, 2 * host / 3) for w in weights]
    return fwd, bwd


def _timer(topology: Topology, table: BandwidthTable | None, runtime: RuntimeCosts) -> Callable:
    """``time_of(c)``: :func:`collective_time`, cached by object (units of one size share their
    collectives), with the separate scales all-gather when ``runtime.scale_gather``."""
    cache: dict[int, float] = {}

    def time_of(c: Collective) -> float:
        t = cache.get(id(c))
        if t is None:
            if runtime.scale_gather and c.op == "all_gather_int8":
                t = _split_scale_gather(c, topology, table) + quantizer_time(c, topology)
            else:
                t = collective_time(c, topology, table)
            cache[id(c)] = t
        return t

    return time_of


def _split_scale_gather(c: Collective, topology: Topology, table: BandwidthTable | None) -> float:
    """Wire time of an int8 all-gather sent as two calls, the codes then their fp32 scales (DeepSpeed's
    ``zero_quantized_weights``: two ``all_gather_into_tensor`` calls per fetch)."""
    if not c.message_bytes or not c.quant_numel:
        return _wire_time(c, topology, table)
    d = max(1, c.group_size)
    codes = min(c.message_bytes, c.quant_numel * d // (d + 1))  # one byte per gathered value
    sent = c.bytes_sent * codes // c.message_bytes
    first = replace(c, message_bytes=codes, bytes_sent=sent)
    scales = replace(c, message_bytes=c.message_bytes - codes, bytes_sent=c.bytes_sent - sent)
    return _wire_time(first, topology, table) + _wire_time(scales, topology, table)


def _with_window(schedule: StepSchedule, window: int | None) -> StepSchedule:
    """``schedule`` with every unit's prefetch depth capped at ``window`` units ahead."""
    if window is None:
        return schedule
    units = tuple(
        replace(u, prefetch=min(u.prefetch, window), prefetch_backward=min(u.prefetch_backward, window))
        for u in schedule.units
    )
    return replace(schedule, units=units)


def _micro_batches(schedule: StepSchedule, fwd, bwd, time_of, overlap: OverlapModel, debt_of):
    """Simulate the step's micro-batches (the middle ones are alike; the first also waits for the
    units' ``first_forward``, the last runs their ``last_reduce``): (seconds, slowdown, {id: [collective,
    calls, seconds, exposed]})."""
    M = schedule.micro_batches
    has_first = any(u.first_forward or u.first_micro_forward is not None for u in schedule.units)
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
        end, slow, comm, busy = _simulate(schedule, fwd, bwd, time_of, overlap, first, last, debt_of)
        micro_time += weight * end
        slow_total += weight * slow
        exposed = _exposure(comm, busy, end)
        for k, (s, e, c) in enumerate(comm):
            acc = by_obj.setdefault(id(c), [c, 0, 0.0, 0.0])
            acc[1] += weight
            acc[2] += (e - s) * weight
            acc[3] += exposed.get(k, 0.0) * weight
    return micro_time, slow_total, by_obj


def _shares(schedule: StepSchedule, by_obj: dict, time_of, overlap: OverlapModel) -> tuple[dict, float]:
    """Seconds per (phase, op, group, tier), the step-end collectives added: (shares, step-end seconds)."""
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
    return shares, step_end


def _all_comm(schedule: StepSchedule, time_of, step_end: float) -> float:
    """All communication of the step if nothing overlapped."""
    units = schedule.units
    M = schedule.micro_batches
    per_micro = sum(time_of(c) for u in units for c in u.backward + u.reduce)
    gathers = sum(n * time_of(c) for u in units for colls, n in u.forward_counts(M) for c in colls)
    once = sum(time_of(c) for u in units for c in u.last_reduce + u.first_forward)
    return M * per_micro + gathers + once + step_end


def _compute_rate(topology: Topology, efficiency: float, achieved_tflops: float | None) -> float:
    """FLOP/s the compute runs at: ``achieved_tflops`` when given, else the device's peak × efficiency."""
    if achieved_tflops is not None:
        if not 0 < achieved_tflops <= 1e7:
            raise ValueError(f"achieved_tflops must be in (0, 1e7], got {achieved_tflops}")
        return achieved_tflops * 1e12
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    return topology.device.peak_tflops * 1e12 * efficiency


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
    achieved_tflops: float | None = None,
    runtime: RuntimeCosts | None = None,
    optimizer: OptimizerShard | None = None,
) -> StepTime:
    """Step time of ``schedule`` (see the module notes). A device with unknown peak (0 TFLOPS) and no
    ``achieved_tflops`` is costed on communication alone. ``runtime``: the framework's fixed costs
    (:class:`RuntimeCosts`; none by default); ``optimizer``: the rank's optimizer shard, whose step is
    priced as memory traffic (:func:`optimizer_time`; none by default)."""
    rate = _compute_rate(topology, efficiency, achieved_tflops)
    overlap = device_overlap(overlap or OverlapModel(), topology)
    runtime = runtime or RuntimeCosts()
    schedule = _with_window(schedule, runtime.fetch_window)
    M = schedule.micro_batches
    samples = micro_batch * M
    flops = shape.step_flops(samples, checkpoint_activations=checkpoint_activations)
    compute = flops / rate if rate > 0 else 0.0
    fwd, bwd = _compute_split(schedule, compute / M, checkpoint_activations, runtime)
    time_of = _timer(topology, table, runtime)
    micro_time, slow_total, by_obj = _micro_batches(
        schedule,
        fwd,
        bwd,
        time_of,
        overlap,
        lambda c: quantizer_time(c, topology) + transport_time(c, topology),
    )
    host_wait = M * (sum(fwd) + sum(bwd)) - compute  # compute time the host work added
    shares, step_end = _shares(schedule, by_obj, time_of, overlap)
    hidden_end = min(overlap.step_end_overlap * step_end, sum(bwd))
    optim_s = optimizer_time(optimizer, topology) if optimizer else 0.0
    total = micro_time + step_end - hidden_end + optim_s
    peak = topology.device.peak_tflops * 1e12
    tokens = samples * shape.seq_length * topology.world_size
    model_flops = shape.step_flops(samples, checkpoint_activations=False)
    breakdown = tuple(
        TimeShare(p, op, g, tier, int(v[0]), v[1], v[2]) for (p, op, g, tier), v in sorted(shares.items())
    )
    return StepTime(
        step_time_s=total,
        compute_s=compute,
        comm_s=_all_comm(schedule, time_of, step_end),
        exposed_comm_s=max(0.0, total - compute - slow_total - optim_s - host_wait),
        tokens_per_s=tokens / total if total > 0 else 0.0,
        tflops_per_device=flops / total / 1e12 if total > 0 and rate > 0 else 0.0,
        mfu=model_flops / total / peak if total > 0 and peak > 0 else 0.0,
        slowdown_s=slow_total,
        breakdown=breakdown,
        optimizer_s=optim_s,
        host_s=host_wait,
    )
