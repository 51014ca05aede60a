"""``--regime device-clock``: the benchmark's settings on the emulated device clock (:mod:`.clock`).

The target is NeoX-20B (configs/neox-20b.yml) on Frontier GCDs arranged as the emulated topology's tree
at its node count (:func:`zerotopo_lab.bench.clock.target_topology`). :func:`derive` measures this
machine's arithmetic rate (the ``no-comm`` row on every rank, in processor time: :func:`planned_rate`),
picks D so that the real arithmetic of a step is a share of its waited device time
(:func:`~zerotopo_lab.bench.clock.arithmetic_share`: a tenth up to 16 ranks, less beyond), and shapes
each tier at the target's bandwidth × k / D with its latency × D, a node's ranks sharing one uplink.
:func:`cost_topology` is the machine the cost model prices the rows on so that its predictions and the
measured steps stand for the same target.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zerotopo_lab.bench import clock as C

REGIME = "device-clock"


@dataclass(frozen=True)
class Workload:
    """The target's work on each rank at one node count."""

    nodes: int
    ranks: int
    micro_batch: int
    """Target sequences per micro-batch per rank (its device time is per micro-batch of these)."""
    micro_batches: int
    """Micro-batches per step per rank."""
    global_batch: int
    """Sequences per step over every rank."""
    mode: str

    def describe(self) -> str:
        return (
            f"{self.micro_batches} micro-batches x {self.micro_batch} sequences per rank on {self.ranks} ranks "
            f"({self.nodes} nodes): {self.global_batch} sequences per step ({self.mode})"
        )


MODES = ("global-batch", "micro-batch")
"""``global-batch``: the target config's global batch split over the ranks (fewer micro-batches per
rank as nodes grow, as when a user scales out); ``micro-batch``: a fixed number of micro-batches per
rank (the global batch grows with the nodes)."""


def workload(
    nodes: int, ranks_per_node: int, micro_batch: int, global_batch: int, mode: str = "global-batch",
    micro_batches: int = 1,
) -> Workload:  # fmt: skip
    """The work per rank at ``nodes`` nodes: ``global-batch`` splits ``global_batch`` sequences over
    the ranks in micro-batches of ``micro_batch`` (at least one per rank; an error when they do not
    divide it evenly); ``micro-batch`` runs ``micro_batches`` per rank."""
    ranks = nodes * ranks_per_node
    if mode == "micro-batch":
        return Workload(nodes, ranks, micro_batch, micro_batches, ranks * micro_batch * micro_batches, mode)
    if mode != "global-batch":
        raise ValueError(f"unknown workload mode {mode!r}; modes are {', '.join(MODES)}")
    per_rank, rest = divmod(global_batch, ranks * micro_batch)
    if rest or per_rank < 1:
        raise ValueError(
            f"a global batch of {global_batch} sequences does not split into micro-batches of {micro_batch} "
            f"over {ranks} ranks; choose a node count whose ranks divide {global_batch // micro_batch}, or "
            "the micro-batch mode"
        )
    return Workload(nodes, ranks, micro_batch, per_rank, global_batch, mode)


def target_workload(
    nodes: int, ranks_per_node: int, mode: str = "global-batch", micro_batches: int = 1
) -> Workload:
    """:func:`workload` with the target config's micro-batch and global batch (NeoX-20B: 4 x 384 GCDs
    = 1,536 sequences)."""
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.regime import TARGET_MODEL, TARGET_NODES, _target

    _, neox = _target(TARGET_MODEL)
    micro = neox.batch.micro_batch_size or 1
    gcds = TARGET_NODES * load_topology(C.TARGET_DEVICE).devices_per_node
    global_batch = micro * (neox.batch.gradient_accumulation_steps or 1) * gcds
    return workload(nodes, ranks_per_node, micro, global_batch, mode, micro_batches)


def planned_rate(runs: list[dict[str, Any]], step_flops: float, cores: int) -> float:
    """FLOP/s per rank that D is planned for, from the start's ``no-comm`` run on every rank (each rank's
    processor seconds per step, ``cpu_s``): the model's FLOPs of a step over the median rank's fastest
    step in processor time, shared over ``cores`` when the ranks outnumber them.

    Processor time is what a rank's arithmetic costs whatever else runs on the machine; the wall time of
    a step (what the rate was before) also holds the time the rank waited for a core, which other work
    on a shared machine can stretch several-fold. The ranks' arithmetic still shares the cores, so a
    rank is planned at its share of them, as a quiet machine's wall time would give it."""
    best = sorted(min(r["cpu_s"]) for r in runs if r.get("cpu_s"))
    if not best or best[len(best) // 2] <= 0:
        raise ValueError("the no-comm run reported no processor time per step")
    return step_flops / (best[len(best) // 2] * max(1.0, len(runs) / cores))


def measure_rate(opts: Any, topo: Any, cfg: Any, seq: int, batch: int) -> float:
    """:func:`planned_rate` of the ``no-comm`` row run at start on every rank
    (:func:`zerotopo_lab.bench.compare.floor_runs`) with this machine's cores; the ``measure`` of
    :func:`derive`."""
    import os

    from zerotopo_lab.bench.compare import floor_runs

    runs = floor_runs(opts, topo, cfg, seq, batch)
    flops = cfg.shape(seq).step_flops(batch, checkpoint_activations=cfg.checkpoint_activations)
    return planned_rate(runs, flops, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class ClockSettings:
    """The clock a run derived and the figures it came from (printed in the report)."""

    clock: C.DeviceClock
    target: Any
    """The emulated target machine (:func:`zerotopo_lab.bench.clock.target_topology`)."""
    flops_per_rank: float
    """This machine's arithmetic rate per rank, FLOP/s, measured at start (:func:`planned_rate`)."""
    arithmetic_s: float
    """Real arithmetic of one step on one rank at that rate."""
    device_s: float
    """Undilated device time of one step's units on one rank."""
    rates_mbit: dict[str, float]
    delays_ms: dict[str, float]
    workload: Workload
    share: float | None
    """The arithmetic share D was planned for (:func:`~zerotopo_lab.bench.clock.arithmetic_share`); None
    when D was given (``--dilation``)."""

    def to_dict(self) -> dict[str, Any]:
        waited = self.clock.dilation * self.device_s
        return {
            **self.clock.to_dict(),
            "target": f"NeoX-20B units on {self.target.world_size} {self.target.device.name}s "
            f"({self.target.nodes} nodes of {self.target.devices_per_node})",
            "flops_per_rank": self.flops_per_rank,
            "arithmetic_s_per_step": self.arithmetic_s,
            "arithmetic_share": self.share,
            "dilation_given": self.share is None,
            "device_s_per_step": self.device_s,
            "waited_s_per_step": waited,
            "predicted_arithmetic_fraction": C.arithmetic_fraction(self.arithmetic_s, waited),
            "link_rates_mbit": self.rates_mbit,
            "link_delays_ms": self.delays_ms,
            "workload": self.workload.describe(),
        }


def derive(
    opts: Any, topo: Any, cfg: Any, seq: int, measure: Any, work: Workload | None = None,
) -> tuple[Any, ClockSettings]:  # fmt: skip
    """``opts`` on the clock and the settings: ``measure(opts, topo, cfg, seq, batch) -> FLOP/s`` per
    rank (:func:`measure_rate`); D planned for ``opts.arithmetic_share`` (None: the ranks'
    :func:`~zerotopo_lab.bench.clock.arithmetic_share`), or ``opts.dilation`` when given (the rate is
    still measured: the report prints the arithmetic's share of the waited time). The target micro-batch
    is the config's; the micro-batches per step are ``opts.micro_batches`` (``bench scale`` sets them
    from ``work``, the :func:`target_workload` it states; without it, a fixed number per rank). The waits recompute a
    layer's forward in its backward as the target does; the bench model's own arithmetic need not (its
    ``checkpoint`` setting stands). ``opts.target_buckets``: DeepSpeed's buckets scaled by k
    (:func:`zerotopo_lab.bench.regime.deepspeed_buckets`)."""
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.regime import TARGET_MODEL, _target, layer_ratio

    target_shape, neox = _target(TARGET_MODEL)
    device_topo = load_topology(C.TARGET_DEVICE)
    target = C.target_topology(topo, device_topo, topo.nodes)
    micro = neox.batch.micro_batch_size or 1
    forward = C.unit_forward_times(target_shape, micro * target_shape.seq_length, device_topo.device.peak_tflops,
                                   device_topo.device.memory_bandwidth_gbps)  # fmt: skip
    shape = cfg.shape(seq)
    k = layer_ratio(shape)
    recompute = bool(neox.model.checkpoint_activations)
    undilated = C.DeviceClock(1.0, k, forward, recompute, device_topo.device.memory_bandwidth_gbps)
    device_s = undilated.step_wait(cfg.num_layers, opts.micro_batches)
    flops = measure(opts, topo, cfg, seq, opts.batch)
    arithmetic = (
        shape.step_flops(opts.batch * opts.micro_batches, checkpoint_activations=opts.checkpoint) / flops
    )
    if opts.dilation is not None:
        share, D = None, opts.dilation
    else:
        share = (
            C.arithmetic_share(topo.world_size) if opts.arithmetic_share is None else opts.arithmetic_share
        )
        D = C.dilation(arithmetic, device_s, share)
    clock = replace(undilated, dilation=D)
    rates, delays = C.link_rates_mbit(target, k, D), C.link_delays_ms(target, D)
    net = topo.network.name
    opts = replace(opts, device_clock=clock, network_mbit=rates[net], rates=dict(rates), delays_ms=delays,
                   node_uplink=True, memory_cap_bytes=None)  # fmt: skip
    if opts.target_buckets:
        from zerotopo_lab.bench.regime import deepspeed_buckets

        opts = replace(opts, deepspeed_buckets=deepspeed_buckets(k))
    if opts.curves is not None:
        # the curves stand for the fabric at this node count, D times the target's time; the links run at
        # their fastest and count bytes
        from zerotopo_lab.bench.regime import FASTEST_MBIT
        from zerotopo_lab.bench.replay import Replay

        replay = Replay(opts.curves, k, D, topo.devices_per_node, device_topo.devices_per_node, topo.nodes)
        opts = replace(opts, replay=replay, network_mbit=FASTEST_MBIT, rates={}, delays_ms={})
        rates, delays = {}, {}
    work = work or workload(topo.nodes, topo.devices_per_node, micro, 0, "micro-batch", opts.micro_batches)
    return opts, ClockSettings(clock, target, flops, arithmetic, device_s, rates, delays, work, share)


def cost_topology(
    settings: ClockSettings, cfg: Any, seq: int, batch: int, micro_batches: int, checkpoint: bool,
    fast_links: bool = False,
) -> Any:  # fmt: skip
    """The machine the cost model prices the rows on (:func:`zerotopo_lab.bench.clock.emulated_device`);
    ``fast_links``: under the curve replay, its tiers at the links' fastest rate (the replay's waits are
    added to each prediction, :func:`zerotopo_lab.bench.compare.predicted_step`)."""
    flops = cfg.shape(seq).step_flops(batch * micro_batches, checkpoint_activations=checkpoint)
    machine = C.emulated_device(settings.target, settings.clock, flops, cfg.num_layers, micro_batches)
    if not fast_links:
        return machine
    from zerotopo_lab.bench.regime import FASTEST_MBIT, emulated_topology

    fast = emulated_topology(machine, FASTEST_MBIT, 1.0)
    return replace(machine, tiers=fast.tiers, network=fast.network)
