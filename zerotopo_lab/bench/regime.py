"""The regime a benchmark runs in: R, ZeRO-3's communication time over its compute time.

A ratio between plans depends on how communication-bound the run is (docs/bench.md,
"Regimes"), so ``bench compare`` states R twice: the target's, from the cost model for the
workload the benchmark stands for (NeoX-20B on 48 Frontier nodes at its configured micro-batch, the
shipped RCCL curves), and the one it measured (the ``zero3`` row's step beyond the ``no-comm`` row's,
over the ``no-comm`` row's: CPU ranks run their collectives on the thread that computes, so that
difference is the row's communication time; per repeat, the median over the repeats,
:func:`measured_ratio`).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from typing import Any

TARGET_MODEL = "neox-20b"  # the built-in config (configs/neox-20b.yml), found from any directory
TARGET_TOPOLOGY = "frontier"
TARGET_NODES = 48


@dataclass(frozen=True)
class TargetRegime:
    """The cost model's R for the target workload, per ZeRO-3 schedule."""

    description: str
    zero3: float
    """The engine's ``zero3`` schedule: all its collectives' time over the compute time."""
    deepspeed_zero3: float
    """DeepSpeed ZeRO-3's per-module schedule (its gathers fall in the curves' mid-size slow band)."""
    compute_per_micro_batch_s: float = 0.0
    """The target's compute time of one micro-batch on one device (the curve replay's time scale)."""
    layer_share: float = 1.0
    """One layer's share of the target's compute (:func:`layer_share`): a bench collective stands for a
    target layer's, so the replay scales time per layer."""


@functools.lru_cache(maxsize=4)
def _target(model: str) -> tuple[Any, Any]:
    """The target model's shape and config, read once per process (both are frozen)."""
    from zerotopo.config.model_files import load_model

    return load_model([model], None)


def target_regime(
    model: str = TARGET_MODEL, topology: str = TARGET_TOPOLOGY, nodes: int = TARGET_NODES
) -> TargetRegime:
    """R of ``model`` on ``nodes`` nodes of ``topology`` with the topology's shipped curves, at the
    config's micro-batch, accumulation, checkpointing and gradient width (as ``zerotopo plan``)."""
    from zerotopo.cost.planner import CostOptions
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.presets import estimate

    shape, neox = _target(model)
    topo = load_topology(topology, nodes=nodes)
    micro = neox.batch.micro_batch_size or 1
    opts = CostOptions(
        micro_batch=micro,
        grad_accum=neox.batch.gradient_accumulation_steps or 1,
        checkpoint_activations=bool(neox.model.checkpoint_activations),
        grad_dtype=neox.precision.grad_dtype,
    )

    def time(name: str) -> Any:
        return estimate(name, shape, topo, opts).time

    zero3, deepspeed = time("zero3"), time("deepspeed-zero3")
    return TargetRegime(
        f"{shape.name} on {nodes} {topology} nodes, micro-batch {micro}, shipped curves",
        zero3.comm_s / zero3.compute_s,
        deepspeed.comm_s / deepspeed.compute_s,
        zero3.compute_s / opts.grad_accum,
        layer_share(shape),
    )


def layer_share(shape: Any) -> float:
    """One transformer layer's share of a forward pass's FLOPs (layers, head; the embedding computes
    nothing): the same share of the step under recomputation."""
    layer = shape.layer_unit().flops_per_token
    return layer / (shape.num_layers * layer + shape.head_unit().flops_per_token)


def derived_vocab(layer_params: int, hidden: int, model: str = TARGET_MODEL) -> int:
    """The bench vocabulary whose embedding is to a bench layer as the target's embedding is to its
    layer (NeoX-20B: 0.68 of a layer), padded to a multiple of 128 as NeoX pads it. A bench layer's
    gathers stand for a target layer's (messages over :func:`layer_ratio`); with this vocabulary the
    embedding's and the output projection's gathers stand for the target's too."""
    target, _ = _target(model)
    want = target.embedding_params() / target.layer_params() * layer_params / hidden
    return max(128, round(want / 128) * 128)


def measured_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """The ``zero3`` row's communication time over the ``no-comm`` row's step in each repeat: each
    repeat's zero3 run against the same repeat's floor run (the medians of their steps), so a drift of
    the machine between repeats cancels; a row without per-repeat figures counts as one repeat of its
    step time. Empty without both rows."""
    by = {r["name"]: r for r in rows}
    floor, zero3 = by.get("no-comm"), by.get("zero3")
    if not floor or not zero3 or not floor.get("step_time_s") or not zero3.get("step_time_s"):
        return []
    fs = floor.get("repeat_step_times_s") or [floor["step_time_s"]]
    zs = zero3.get("repeat_step_times_s") or [zero3["step_time_s"]]
    return [(z - f) / f for f, z in zip(fs, zs)]


def measured_ratio(rows: list[dict[str, Any]]) -> float | None:
    """The measured R: the median of :func:`measured_ratios` (None without the ``zero3`` and ``no-comm``
    rows). The median of the pairs, not the difference of the two rows' medians, is the figure that drift
    between repeats does not move (docs/bench.md gives measured spreads of both)."""
    ratios = measured_ratios(rows)
    return statistics.median(ratios) if ratios else None


# -- the emulation that matches it ------------------------------------------------------------------

REGIMES = ("frontier-20b", "comm-bound", "device-clock")
"""``bench compare --regime``: ``frontier-20b`` derives tokens, checkpointing and link rate from the
target's R (:func:`derive`); ``comm-bound`` is the earlier fixed setting (model ``small``, 2 sequences x 4
micro-batches per rank, 50 Mbit/s per rank, every rank its own link), ZeRO-3 about 20x comm-bound;
``device-clock`` runs every rank's compute on the emulated device clock (:mod:`zerotopo_lab.bench.clocked`)."""
MIN_TOKENS = 2048
"""Tokens per micro-batch per rank at least: enough that matmuls dominate the step on a CPU rank."""
GCD_MEMORY_BYTES = 64 * 2**30
"""Device memory of one Frontier GCD, which the emulated cap is proportional to (:func:`memory_cap`)."""
FASTEST_MBIT = 1e5
"""The link rate per rank, Mbit/s, under ``--curves`` (and the top of :func:`link_rate_for`'s range)."""
DEEPSPEED_BUCKETS = {"prefetch": 5e7, "reduce": 5e8, "persistence": 1e5}
"""DeepSpeed's stage-3 defaults (elements), sized for NeoX-20B-class layers (:func:`deepspeed_buckets`)."""


@dataclass(frozen=True)
class Regime:
    """Settings of a regime-matched run and the figures they came from (printed in the report)."""

    name: str
    target_R: float
    predicted_R: float
    """The cost model's ZeRO-3 R of the emulation at the chosen link rate."""
    flops_per_rank: float
    """This machine's compute rate per rank, FLOP/s: the compute floor's, the ``no-comm`` row run on
    every rank at start (:func:`zerotopo_lab.bench.compare.measure_compute`)."""
    batch: int
    seq: int
    micro_batches: int
    checkpoint_activations: bool
    network_mbit: float
    """Inter-node rate per rank, Mbit/s; a node's ranks share ``network_mbit x ranks per node``."""
    memory_cap_bytes: float
    layer_ratio: float
    """Bench layer over NeoX-20B layer, in elements: DeepSpeed's buckets and the curve replay scale by it."""
    replay_factor: float = 1.0
    """``--curves``: what the replay's per-layer time scale is multiplied by (:func:`derive`)."""

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.batch * self.seq


def emulated_topology(topo: Any, network_mbit: float, flops_per_rank: float) -> Any:
    """``topo`` as the shaped emulation runs it: every tier at :func:`zerotopo.launch.netem.tier_rates`
    of ``network_mbit``, the network a node's shared uplink, the device at ``flops_per_rank``."""
    from dataclasses import replace

    from zerotopo.launch.netem import tier_rates

    rates = tier_rates(topo, network_mbit)
    tiers = tuple(replace(t, bandwidth_gbps=rates[t.name] / 8000) for t in topo.tiers)
    network = replace(topo.network, injection_gbps=rates[topo.network.name] / 8000 * topo.devices_per_node)
    device = replace(topo.device, peak_tflops=flops_per_rank / 1e12)
    return replace(topo, tiers=tiers, network=network, device=device)


def emulated_R(
    shape: Any, topo: Any, batch: int, micro_batches: int, checkpoint: bool, **extra: Any
) -> float:
    """The cost model's ZeRO-3 communication over compute time on ``topo`` (:func:`emulated_topology`),
    measured compute rate (efficiency 1), alpha-beta links (no shipped curve); ``extra``: more
    :class:`CostOptions` (the widths on the wire, :func:`zerotopo_lab.bench.wire_bytes`; fp32
    without them)."""
    from zerotopo.cost.planner import CostOptions, estimate
    from zerotopo_lab.presets import resolve

    extra = {"param_bytes": 4, **extra}
    opts = CostOptions(micro_batch=batch, grad_accum=micro_batches, checkpoint_activations=checkpoint,
                       efficiency=1.0, default_bandwidth=False, **extra)  # fmt: skip
    t = estimate(resolve("zero3")[0], shape, topo, opts).time
    return t.comm_s / t.compute_s


def link_rate_for(
    target: float, rate_of: Any, lo: float = 1.0, hi: float = FASTEST_MBIT
) -> tuple[float, float]:
    """(Mbit/s, R) where ``rate_of(mbit)`` (R, falling as the link gets faster) meets ``target``:
    bisection on log rate; the end of ``[lo, hi]`` nearest the target when it lies outside."""
    import math

    r_lo, r_hi = rate_of(lo), rate_of(hi)
    if target >= r_lo:
        return lo, r_lo
    if target <= r_hi:
        return hi, r_hi
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if rate_of(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi, rate_of(hi)


def derive(
    target_R: float,
    flops_per_rank: float,
    cfg: Any,
    seq: int,
    topo: Any,
    memory_cap: Any,
    replayed: Any = None,
    **extra: Any,
) -> Regime:
    """The emulation whose ZeRO-3 R is ``target_R`` by the cost model: :data:`MIN_TOKENS` tokens per
    micro-batch per rank (``seq`` long sequences), one micro-batch per step, activation checkpointing only
    when zero3's memory would pass the cap without it (``memory_cap(checkpoint) -> (cap, zero3 bytes)``),
    and the link rate from :func:`link_rate_for`. ``replayed(checkpoint)``: the R a curve replay adds to
    zero3 at its per-layer time scale (``--curves``): then the links run at :data:`FASTEST_MBIT` (they
    count bytes; the curves stand for the fabric) and the replay's time is scaled by
    :attr:`Regime.replay_factor` so that zero3's R, links and replay together, is the target's (a
    one-layer model gathers its embedding and output projection beside one layer, which at the target
    are two units among 46: unscaled, its replayed R would pass the target's). ``extra``: more
    :class:`CostOptions` (the overlap, the wire widths)."""
    import math

    batch = max(1, math.ceil(MIN_TOKENS / seq))
    shape = cfg.shape(seq, name="bench")
    checkpoint = checkpointing(memory_cap)
    cap, _ = memory_cap(checkpoint)

    def rate_of(mbit: float) -> float:
        topology = emulated_topology(topo, mbit, flops_per_rank)
        return emulated_R(shape, topology, batch, 1, checkpoint, **extra)

    factor = 1.0
    if replayed is None:
        mbit, predicted = link_rate_for(target_R, rate_of)
    else:
        mbit, links, offset = FASTEST_MBIT, rate_of(FASTEST_MBIT), replayed(checkpoint)
        factor = max(0.0, target_R - links) / offset if offset > 0 else 1.0
        predicted = links + factor * offset
    return Regime("frontier-20b", target_R, predicted, flops_per_rank, batch, seq, 1, checkpoint,
                  round(mbit, 1), cap, layer_ratio(shape), factor)  # fmt: skip


def checkpointing(memory_cap: Any) -> bool:
    """Whether the regime checkpoints activations: only when zero3's memory without it would pass the cap
    (``memory_cap(checkpoint) -> (cap, zero3 bytes)``, as :func:`derive` takes it)."""
    cap, need = memory_cap(False)
    return need > cap


def layer_ratio(shape: Any, model: str = TARGET_MODEL) -> float:
    """Elements of one layer of ``shape`` over one layer of the target model."""
    target, _ = _target(model)
    return shape.layer_params() / target.layer_params()


def deepspeed_buckets(ratio: float) -> dict[str, int]:
    """DeepSpeed's stage-3 prefetch bucket, reduce bucket and persistence threshold (elements) scaled
    from their defaults by ``ratio`` (:func:`layer_ratio`), so a layer is the same fraction of a bucket as
    a NeoX-20B layer is of the default one (at the defaults a bench model prefetches everything at once)."""
    return {k: max(1, round(v * ratio)) for k, v in DEEPSPEED_BUCKETS.items()}


def memory_cap(bench_bytes: float, target_bytes: float) -> float:
    """The emulated per-rank memory cap: :data:`GCD_MEMORY_BYTES` times the bench's zero3 memory (model
    states plus activations, cost model) over NeoX-20B's on 48 Frontier nodes, so each rank is as full
    as a GCD under the target's ZeRO-3."""
    return GCD_MEMORY_BYTES * bench_bytes / target_bytes


def target_zero3_memory(
    model: str = TARGET_MODEL, topology: str = TARGET_TOPOLOGY, nodes: int = TARGET_NODES
) -> float:
    """Bytes per GCD of the target's zero3 plan (model states and activations) by the cost model."""
    from zerotopo.cost.planner import CostOptions
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.presets import estimate

    shape, neox = _target(model)
    opts = CostOptions(micro_batch=neox.batch.micro_batch_size or 1,
                       checkpoint_activations=bool(neox.model.checkpoint_activations))  # fmt: skip
    return estimate("zero3", shape, load_topology(topology, nodes=nodes), opts).memory.total


def fits(predicted_bytes: float | None, cap: float | None) -> bool:
    """Whether a row whose predicted memory is ``predicted_bytes`` runs under ``cap`` (None: unknown
    prediction or no cap, it runs)."""
    return predicted_bytes is None or cap is None or predicted_bytes <= cap
