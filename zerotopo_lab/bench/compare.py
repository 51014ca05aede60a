"""``zerotopo bench compare``: zerotopo's plans, DeepSpeed ZeRO-3 / hpZ and FSDP2 on one emulated cluster.

Every row trains the same GPT-NeoX (:func:`zerotopo_lab.bench.rows.build_model`, one seed) on the same
synthetic token sequences (:func:`batches`: rank, step and micro-batch decide them), with the same
micro-batch size, micro-batches per step, dtype (:mod:`.precision`), AdamW settings and step count, on the same
ranks. The rows run one after the other, each run of each row in rank processes of its own
(:func:`run_rows`), on the same machine and the same emulated network (:func:`zerotopo.launch.netem.emulated_cluster`: one namespace per rank, every tier a
shaped link). Per row, rank 0's JSON carries:

- ``step_time_s`` (median of the timed steps, barrier to barrier) and ``tokens_per_s``;
- ``predicted_step_time_s``: the cost model's (:func:`zerotopo.cost.time.step_time` through
  :func:`zerotopo.cost.planner.estimate`) for zerotopo rows and the DeepSpeed rows (on DeepSpeed's
  schedule, :func:`framework_cost`), None for the FSDP2 rows;
- ``tier_bytes_per_step``: bytes one rank sent per step across each tier, mean over ranks, read from
  the htb class counters of the shaped links (everything on the wire: payload, TCP/IP headers, ACKs)
  over the timed steps; for the engine's rows, whose post-step parameter gathers run beside the next
  step's forward (so counters read at the timed steps' boundaries caught an unknown part of one step's
  gathers and missed part of another's), from the start of the last warm-up step to the end of the
  last timed step with what it left in flight landed (``Row.settle``), outside the timed steps (a
  DeepSpeed row's first step sends otherwise than its later ones); ``tier_payload_bytes_per_step``
  the same less each packet's TCP/IP headers (:data:`zerotopo_lab.bench.measure.FRAME_BYTES`), and
  ``network_bytes_over_ring`` / ``network_payload_over_ring`` each across nodes over the schedule's
  bytes hop by hop (``ring_tier_bytes``, :mod:`zerotopo_lab.bench.ringbytes`), and
  ``network_excess_bytes_per_message`` the payload beyond those bytes over the messages the schedule
  sends across nodes (``ring_tier_messages``): what the transport adds per message;
- ``peak_memory_bytes``: the largest per-rank peak (:mod:`zerotopo_lab.bench.measure`);
- ``final_loss``: the mean loss of the last step over ranks and micro-batches.

The comparison is *void* when a row's final loss differs from the reference row's (the first row that
neither quantizes nor differs in arithmetic) by more than the tolerance: :data:`EXACT_RTOL` for rows
that communicate in full precision, :data:`QUANTIZED_RTOL` for rows with int8/int4 collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from zerotopo.errors import ConfigError, ZerotopoError
from zerotopo_lab.bench import FLOOR_ROW, FRAMEWORK_ROWS, PRECISIONS, wire_bytes
from zerotopo_lab.bench.regime import REGIMES, Regime, fits, measured_ratio, measured_ratios, target_regime
from zerotopo_lab.bench.replay import CURVES, Replay

ZEROTOPO_ROWS = ("zerotopo", "planner", "zero3", "zeropp", "mics")
DEFAULT_ROWS = (FLOOR_ROW,) + ZEROTOPO_ROWS + FRAMEWORK_ROWS
EXACT_RTOL = 2e-3
"""Relative loss tolerance between rows that all communicate in fp32 (summation order differs)."""
QUANTIZED_RTOL = 3e-2
DEFAULT_REPEAT = 3
"""``--repeat``'s default: runs of every row, so each figure is a median with its spread."""
"""Relative loss tolerance for rows with int8 weight gathers / int4 gradient reduce-scatters."""

MODELS: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 32, "layers": 2, "heads": 2, "vocab": 256, "seq": 32},
    "small": {"hidden": 128, "layers": 4, "heads": 4, "vocab": 1024, "seq": 64},
    "medium": {"hidden": 256, "layers": 4, "heads": 4, "vocab": 2048, "seq": 64},
    "wide": {"hidden": 384, "layers": 1, "heads": 6, "vocab": 256, "seq": 256},
}
"""Built-in benchmark models (``--model NAME``); ``--model`` also takes a NeoX YAML from configs/."""


@dataclass(frozen=True)
class CompareOptions:
    """What ``zerotopo bench compare`` runs; picklable, so the ranks receive it."""

    topology: str = "emulated-frontier"
    model: str = "small"
    rows: tuple[str, ...] = DEFAULT_ROWS
    steps: int = 3
    """Timed steps per row."""
    warmup: int = 1
    """Untimed steps first (the engine records the forward order on its first step)."""
    micro_batches: int = 4
    """Micro-batches per step (gradient accumulation ``M``)."""
    batch: int = 2
    """Sequences per micro-batch per rank."""
    seq: int | None = None
    """Tokens per sequence (default: the model's)."""
    vocab: int | None = None
    """Vocabulary for a NeoX YAML model (default 1024)."""
    lr: float = 1e-3
    emulate: bool = True
    """Each rank in its own namespace behind shaped links (root); False: plain loopback."""
    network_mbit: float = 50.0
    rates: dict[str, float] = field(default_factory=dict)
    """Per-tier rate overrides, Mbit/s (``--shape``)."""
    timeout_s: float = 3600.0
    profile_dir: str | None = None
    """Profile one extra step per row (torch.profiler, rank 0) into this directory."""
    calibration: str | None = None
    """A ``zerotopo calibrate`` file whose tiers, curves and overlap price the predictions (default: the
    topology file and its shipped bandwidth table)."""
    regime: str = "comm-bound"
    """``frontier-20b``: :func:`apply_regime` derives batch, seq, checkpointing, link rate and memory cap
    at start; ``comm-bound``: these options as given."""
    node_uplink: bool = False
    """A node's ranks share one shaped uplink (:func:`zerotopo.launch.netem.emulated_cluster`)."""
    checkpoint: bool = False
    """Activation checkpointing in every row's model."""
    memory_cap_bytes: float | None = None
    """Emulated device memory per rank: rows the cost model says exceed it are not run."""
    deepspeed_buckets: dict[str, int] | None = None
    """DeepSpeed's prefetch/reduce buckets and persistence threshold, elements (None: the row's settings
    as before: persistence 0, DeepSpeed's default buckets)."""
    curves: str | None = None
    """``frontier-48``: replay the shipped Frontier curves' time on every collective (:mod:`.replay`)."""
    replay: Any = None
    """The :class:`zerotopo_lab.bench.replay.Replay` the ranks install (set by :func:`compare`)."""
    dtype: str = "fp32"
    """``bf16``: weights, gathers and gradient reductions in bf16, arithmetic in fp32
    (:mod:`zerotopo_lab.bench.precision`); ``fp32``: everything fp32. Unset on the command line: bf16 for
    ``frontier-20b``, fp32 for ``comm-bound``."""
    repeat: int = 1
    """Runs of every row (interleaved: all rows, then all rows again); a row's step time is the median of
    its runs' medians, reported with their min and max (``--repeat``, default :data:`DEFAULT_REPEAT`)."""
    nodes: int | None = None
    """Emulated nodes (default: the topology file's)."""
    device_clock: Any = None
    """The :class:`zerotopo_lab.bench.clock.DeviceClock` the ranks wait on (``--regime device-clock``; set by
    :func:`compare`)."""
    delays_ms: dict[str, float] = field(default_factory=dict)
    """One-way delay per tier's shaped link, ms (the device clock's latencies x D)."""
    workload: Any = None
    """The :class:`zerotopo_lab.bench.clocked.Workload` the run stands for (``bench scale``), or None."""
    arithmetic_share: float | None = None
    """``--regime device-clock``: the most of a step's waited time the real arithmetic may take, which
    sets D (``--arithmetic-share``; None: :func:`zerotopo_lab.bench.clock.arithmetic_share` of the
    ranks)."""
    dilation: float | None = None
    """``--regime device-clock``: D as given (``--dilation``, e.g. an earlier run's, so that ``bench scale
    --from`` can pool the two runs' repeats) in place of the D planned for the arithmetic share; None:
    planned."""
    target_buckets: bool = False
    """``--regime device-clock``: DeepSpeed's buckets scaled by the clock's k
    (:func:`zerotopo_lab.bench.regime.deepspeed_buckets`, ``--deepspeed-buckets target``), so DeepSpeed
    prefetches and reduces a bench layer as it would a NeoX-20B layer; False: DeepSpeed's defaults, which
    hold the whole bench model."""


# -- model and data ---------------------------------------------------------------------------------


def model_config(opts: CompareOptions) -> tuple[Any, int]:
    """The NeoX config and sequence length of ``opts.model``."""
    from zerotopo.models.config import NeoXConfig

    if opts.model in MODELS:
        m = MODELS[opts.model]
        vocab = opts.vocab or m["vocab"]
        seq = opts.seq or m["seq"]
        cfg = NeoXConfig(
            vocab_size=vocab,
            hidden_size=m["hidden"],
            num_layers=m["layers"],
            num_attention_heads=m["heads"],
            max_position_embeddings=seq,
            checkpoint_activations=opts.checkpoint,
        )
        return cfg, seq
    from zerotopo.config.model_files import load_model

    try:
        _, neox = load_model([opts.model], opts.vocab or 1024)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; or use a built-in benchmark model: {', '.join(MODELS)}", source="--model"
        ) from None
    cfg = replace(neox.model.model_config(opts.vocab or 1024), checkpoint_activations=opts.checkpoint)
    return cfg, opts.seq or neox.model.seq_length


def batches(opts: CompareOptions, vocab: int, seq: int, rank: int, step: int) -> list[tuple[Any, Any]]:
    """The micro-batches of ``rank`` at ``step``: arithmetic token sequences (a random start and stride,
    10% of tokens replaced by noise), learnable within a few steps, identical for every row."""
    import torch

    out = []
    for micro in range(opts.micro_batches):
        g = torch.Generator().manual_seed(1_000_003 * step + 1009 * micro + rank)
        start = torch.randint(0, vocab, (opts.batch, 1), generator=g)
        stride = torch.randint(1, 8, (opts.batch, 1), generator=g)
        ids = (start + stride * torch.arange(seq + 1)) % vocab
        noise = torch.rand(ids.shape, generator=g) < 0.1
        ids = torch.where(noise, torch.randint(0, vocab, ids.shape, generator=g), ids)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


# -- the ranks --------------------------------------------------------------------------------------


def _worker(
    rank: int,
    world: int,
    opts: CompareOptions,
    runs: list[tuple[int, str, Any]],
    tier_classes: dict[str, str],
) -> list[dict[str, Any]]:
    """Each of ``runs`` (repeat, row name, plan) on this rank: its warm-up and timed steps, and what was
    measured of them."""
    import warnings

    import torch.distributed as dist

    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.hosttime import other_threads, others_since, thread_times
    from zerotopo_lab.bench.measure import FRAME_BYTES, PeakMemory, link_tier_counters
    from zerotopo_lab.bench.precision import arithmetic
    from zerotopo_lab.bench.rows import build_row, prepare_row, warm_up

    # DeepSpeed and FSDP2 call torch's all_gather_into_tensor / reduce_scatter_tensor, deprecated in
    # torch 2.13 for the *_single names (the engine's): each rank of each run warned once per call site,
    # hundreds of lines on the terminal that no user of the bench can act on
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
    )
    topo = load_topology(opts.topology, nodes=opts.nodes)
    cfg, seq = model_config(opts)
    out = []
    waited: dict[str, float] = {}
    if opts.replay is not None:
        from zerotopo_lab.bench.replay import install

        waited = install(opts.replay)
    warm_up(cfg)  # before the clock: start-up allocations are not device time
    hook, on_clock, restart = _clock_hook(opts.device_clock)
    for repeat, name, plan in runs:
        try:
            prepare_row(name)
        except ImportError as exc:  # the same on every rank, before any collective of the row
            out.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        memory = PeakMemory()
        t_setup = time.perf_counter()
        row = build_row(name, plan, cfg, topo, rank, opts, hook)
        setup_s = time.perf_counter() - t_setup
        times, losses, cpu = [], [], []
        sent0: dict[str, tuple[int, int]] = {}
        # the links count whole steps, untimed (``tier_bytes_per_step`` in the module docstring)
        first = opts.warmup if row.settle is None else max(opts.warmup - 1, 0)
        counted = opts.warmup + opts.steps - first
        for step in range(opts.warmup + opts.steps):
            data = batches(opts, cfg.vocab_size, seq, rank, step)
            if step == first and row.settle is not None:
                row.settle()
            dist.barrier()
            if step == first:
                sent0 = link_tier_counters(tier_classes)
            if step == opts.warmup:
                waited0 = sum(waited.values())  # the timed steps' waits (a warm-up step can differ)
                clock0, host0, others0 = on_clock(), thread_times(), other_threads()
            restart()  # the clock's balance is a step's: nothing carries across a step's end
            t0, c0 = time.perf_counter(), time.process_time()
            with arithmetic(opts.dtype):
                loss = row.step(data)
            c1 = time.process_time()
            dist.barrier()
            if step >= opts.warmup:
                times.append(time.perf_counter() - t0)
                cpu.append(c1 - c0)
            losses.append(loss)
        clock1, host, others = on_clock(), thread_times() - host0, others_since(others0, other_threads())
        if row.settle is not None:
            row.settle()
            dist.barrier()
        sent1 = link_tier_counters(tier_classes)
        sent = {t: [(b - a) / counted for a, b in zip(sent0.get(t, (0, 0)), sent1[t])] for t in sent1}
        peak = memory.peak_bytes()
        if opts.profile_dir and repeat == 0:
            with arithmetic(opts.dtype):
                profile_step(
                    row, batches(opts, cfg.vocab_size, seq, rank, step + 1), opts.profile_dir, name, rank
                )
        row.close()
        out.append(
            {
                "name": name,
                "repeat": repeat,
                "degrees": row.info.get("degrees", ""),
                "step_times_s": times,
                "cpu_s": cpu,
                "losses": losses,
                "tier_bytes": {t: nbytes for t, (nbytes, _) in sent.items()},
                "tier_payload": {t: nbytes - FRAME_BYTES * packets for t, (nbytes, packets) in sent.items()},
                "peak_memory_bytes": peak,
                "setup_s": setup_s,
                "replay_wait_s": (sum(waited.values()) - waited0) / opts.steps,
                **{f"clock_{k}_s": (clock1[k] - clock0[k]) / opts.steps for k in clock1},
                "thread_cpu_s": host.cpu_s / opts.steps,
                "run_delay_s": host.run_delay_s / opts.steps,
                "others_cpu_s": others.cpu_s / opts.steps,
                "others_run_delay_s": others.run_delay_s / opts.steps,
                "process_groups": len(getattr(dist.distributed_c10d._world, "pg_map", ())),
            }
        )
        del row
    return out


def _clock_hook(clock: Any) -> tuple[Any, Any, Any]:
    """(the model hook of each row, ``() -> {figure: seconds so far}``
    (:meth:`zerotopo_lab.bench.devicewait.Waited.figures`), ``() -> None`` that starts the waits' balance
    afresh (:meth:`~zerotopo_lab.bench.devicewait.Waited.restart`)) on the device clock
    (:mod:`zerotopo_lab.bench.devicewait`, installed in this process now); without a clock, no hook, no
    figures and nothing to restart."""
    if clock is None:
        return None, dict, lambda: None
    from zerotopo_lab.bench.devicewait import install, install_units

    totals = install(clock)
    return (lambda model: install_units(model, clock, totals)), totals.figures, totals.restart


def profile_step(row: Any, data: list, directory: str, name: str, rank: int) -> None:
    """One more step under ``torch.profiler`` (every rank steps, rank 0 records): a table of the ops by
    self CPU time in ``<directory>/<name>.txt`` and a Chrome trace ``<name>.json``."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    if rank:
        row.step(data)
        dist.barrier()
        return
    os.makedirs(directory, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        row.step(data)
    dist.barrier()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    with open(os.path.join(directory, f"{name}.txt"), "w") as f:
        f.write(table + "\n")
    prof.export_chrome_trace(os.path.join(directory, f"{name}.json"))


# -- the launcher -----------------------------------------------------------------------------------


def _quantized(plan: Any) -> bool:
    return bool(plan.quantize_weights or plan.quantize_grads or plan.secondary_dtype in ("int8", "int4"))


def cost_inputs(opts: CompareOptions, topo: Any) -> tuple[Any, dict[str, Any]]:
    """The topology the cost model prices the rows on and the measured inputs of its options: the
    topology file and its shipped table, or ``opts.calibration`` applied (as ``zerotopo plan
    --calibration`` does). The ranks are CPU processes, where the engine (and DeepSpeed) reduce each
    micro-batch's gradients on the thread that computes: the overlap model says so (``host_reduce``).
    Their compute slows while a collective runs because the transport takes processor time on the same
    cores: :func:`compare` measures that per call and per byte (:mod:`zerotopo_lab.bench.transport`) and
    prices it so, in place of the overlap model's slowdown per second in flight (set to 0 here: the
    topology carries the transport figures only once they are measured, after the regime is derived
    from this overlap; from then on :func:`zerotopo.cost.time.device_overlap` would set it anyway)."""
    from zerotopo.cost.time import OverlapModel

    measured: dict[str, Any] = {}
    if opts.calibration:
        from zerotopo.cost.calibration import calibrated

        topo, measured = calibrated(topo, opts.calibration)
    overlap = measured.get("overlap") or OverlapModel()
    return topo, {**measured, "overlap": replace(overlap, host_reduce=True, compute_slowdown=0.0)}


def framework_cost(
    name: str, buckets: dict[str, int] | None = None, *, gloo_reduce: bool = True
) -> tuple[Any, Any] | None:
    """The plan and schedule the cost model prices a framework row with, or None (no model of it).

    ``deepspeed-zero3`` is the ``deepspeed-zero3`` cost preset (:mod:`zerotopo_lab.presets`) with the
    row's settings (:func:`zerotopo_lab.bench.rows.deepspeed_row`): no parameter kept whole
    (``stage3_param_persistence_threshold: 0``), DeepSpeed's default prefetch and reduce buckets; and no
    gather in the backward (``DeepSpeedSchedule.backward_gather``): DeepSpeed's coordinator keeps a
    parameter its prefetcher fetched until that parameter's last use in the recorded trace
    (``__params_to_release``), and traced on the bench's 8 ranks with the row's settings (and again with
    ``stage3_max_live_parameters`` scaled by the layer ratio to 3.9e6), from the second step on it gathers
    every parameter once, in the forward, in one call that the root module's prefetch issues and the
    first module waits for in full (``DeepSpeedSchedule.coalesce_prefetch``,
    docs/bench_model_gap.md). The cost preset keeps the backward gather and one call per module: whether
    DeepSpeed skips the one and coalesces the other for a 20B model was not traced.
    ``deepspeed-hpz`` is the ``deepspeed-zeropp`` preset without its quantized collectives (DeepSpeed's
    qwZ/qgZ need CUDA, so the row runs hpZ alone), its secondary copy per node in the parameters' dtype,
    and the same settings: its link counters show no backward gather (the same bytes as ZeRO-3's in a
    step of one micro-batch), and with several micro-batches the later ones' forwards gather from the
    copy within the node (``DeepSpeedSchedule.hpz_forward``, :mod:`zerotopo_lab.deepspeed_schedule`'s
    note on hpZ's forward).
    FSDP2 has no cost preset: its rows are measured, not predicted. ``buckets``: the row's scaled
    DeepSpeed buckets (:func:`zerotopo_lab.bench.regime.deepspeed_buckets`). ``gloo_reduce``: the rows run on
    gloo, where DeepSpeed's gradient reduce-scatter is an all-reduce
    (``DeepSpeedSchedule.reduce_scatter_all_reduce``); False under ``--curves``, where the replay waits the
    target's reduce-scatter (RCCL runs a real one) and the links, at their fastest, add next to nothing."""
    from zerotopo_lab.presets import COST_PRESETS

    if name == "deepspeed-zero3":
        plan, sched = COST_PRESETS[name]
    elif name == "deepspeed-hpz":
        plan, sched = COST_PRESETS["deepspeed-zeropp"]
        plan = replace(plan, name=name, quantize_weights=False, quantize_grads=False)
    else:
        return None
    # as traced: every parameter gathered once, in the forward, a prefetch's modules in one call (from
    # the hpZ copy after the first micro-batch); the rows run on gloo, whose reduce_scatter_tensor (what
    # DeepSpeed calls) is a full all-reduce
    sched = replace(
        sched,
        backward_gather=False,
        coalesce_prefetch=True,
        hpz_forward=True,
        reduce_scatter_all_reduce=gloo_reduce,
    )
    if buckets is None:
        return plan, replace(sched, persistence_threshold=0)
    return plan, replace(
        sched,
        persistence_threshold=buckets["persistence"],
        prefetch_bucket_elems=buckets["prefetch"],
        reduce_bucket_elems=buckets["reduce"],
    )


def resolve_rows(
    opts: CompareOptions, topo: Any, shape: Any, measured: dict[str, Any] | None = None
) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """(name, plan or None) of every row to run, and per-row metadata (kind, prediction, quantized,
    same_as for a planner pick that equals a preset already in the list). ``topo`` and ``measured``:
    what :func:`cost_inputs` returns."""
    from zerotopo.cost.planner import CostOptions, estimate, pick, placement, plan_candidates
    from zerotopo.placement.plan import get_preset

    cost = CostOptions(
        micro_batch=opts.batch,
        grad_accum=opts.micro_batches,
        **wire_bytes(opts.dtype),
        checkpoint_activations=opts.checkpoint,
        memory_limit_bytes=opts.memory_cap_bytes,
        **(measured or {}),
    )
    specs: list[tuple[str, Any]] = []
    meta: dict[str, Any] = {}
    for name in opts.rows:
        if name == FLOOR_ROW:
            specs.append((name, None))
            meta[name] = {"kind": "floor", "quantized": False, "predicted": None, "plan": None}
            continue
        if name in FRAMEWORK_ROWS:
            kind = name.split("-")[0]
            specs.append((name, None))
            meta[name] = {"kind": kind, "quantized": False, "predicted": None, "plan": None}
            costed = framework_cost(name, opts.deepspeed_buckets, gloo_reduce=opts.curves is None)
            if costed is not None:  # priced on the framework's own schedule
                plan, sched = costed
                est = estimate(plan, shape, topo, cost, schedule=sched)
                meta[name].update(
                    predicted=predicted_step(est, opts),
                    predicted_tier_bytes=dict(est.comm_bytes),
                    **_ring_accounting(est, topo, plan),
                    predicted_memory_bytes=est.memory.total,
                    plan_object=plan,
                    schedule_object=sched,
                )
                _cap(specs, meta[name], opts.memory_cap_bytes)
            continue
        if name == "planner":
            # what `zerotopo plan` recommends (zerotopo.cost.planner.pick); under --curves the candidates
            # ranked again with their replayed waits (the search prices links)
            candidates = [e for e in plan_candidates(shape, topo, plans="auto", options=cost) if e.fits]
            if not candidates:
                raise ZerotopoError(f"the planner found no plan that fits {shape.name} on {topo.name}")
            plan = pick(candidates, lambda e: predicted_step(e, opts)).plan
        else:
            try:
                plan = get_preset(name)
            except ConfigError:
                known = ", ".join(DEFAULT_ROWS)
                raise ConfigError(
                    f"unknown row {name!r}; rows are {known} or a zerotopo preset", key="--rows"
                ) from None
        est = estimate(plan, shape, topo, cost)
        meta[name] = {
            "kind": "zerotopo",
            "plan": plan.name,
            "quantized": _quantized(plan),
            "predicted": predicted_step(est, opts),
            "predicted_tier_bytes": {k: v for k, v in est.comm_bytes.items()},
            **_ring_accounting(est, topo, plan),
            "placement": placement(plan, topo),
            "plan_object": plan,
            "predicted_memory_bytes": est.memory.total,
        }
        if not fits(est.memory.total, opts.memory_cap_bytes):
            meta[name]["does_not_fit"] = True
            continue
        twin = next(
            (n for n, p in specs if p is not None and meta[n]["placement"] == meta[name]["placement"]), None
        )
        if twin is not None:
            meta[name]["same_as"] = twin
        else:
            specs.append((name, plan))
    return specs, meta


def _ring_accounting(est: Any, topo: Any, plan: Any) -> dict[str, Any]:
    """The schedule's bytes and messages per rank per step on each tier, hop by hop
    (:mod:`zerotopo_lab.bench.ringbytes`): ``ring_tier_bytes`` and ``ring_tier_messages``, None without
    a schedule."""
    if est.schedule is None:
        return {"ring_tier_bytes": None, "ring_tier_messages": None}
    from zerotopo_lab.bench.ringbytes import ring_tier_bytes, ring_tier_messages

    degrees = plan.degrees(topo)
    return {
        "ring_tier_bytes": ring_tier_bytes(est.schedule, topo, degrees),
        "ring_tier_messages": ring_tier_messages(est.schedule, topo, degrees),
    }


def predicted_step(est: Any, opts: CompareOptions) -> float:
    """The cost model's step time of a row; under ``--curves`` plus what the replay makes one step of
    its schedule wait (:func:`zerotopo_lab.bench.replay.schedule_wait`: the ranks sleep on the thread that
    computes, so the waits add to the step)."""
    if opts.replay is None or est.schedule is None:
        return est.time.step_time_s
    from zerotopo_lab.bench.replay import schedule_wait

    return est.time.step_time_s + schedule_wait(est.schedule, opts.replay)


def _cap(specs: list[tuple[str, Any]], meta: dict[str, Any], cap: float | None) -> None:
    """Take the row just added to ``specs`` out again when its predicted memory exceeds ``cap``."""
    if not fits(meta.get("predicted_memory_bytes"), cap):
        meta["does_not_fit"] = True
        specs.pop()


def repredict(
    rows: list[dict],
    meta: dict[str, Any],
    opts: CompareOptions,
    topo: Any,
    shape: Any,
    measured_inputs: dict[str, Any] | None = None,
    start_flops_per_rank: float | None = None,
) -> str:
    """With a ``no-comm`` row, price the zerotopo rows again at the compute rate it measured (the
    topology's ``peak_tflops`` is a guess for CPU ranks sharing cores): the device's peak becomes the
    floor's FLOPs per second at efficiency 1. ``start_flops_per_rank``: the rate of the floor run
    :func:`measure_compute` made at start, with the same settings; the rate is then the model's FLOPs
    over the median of every run of the floor, that one and the row's repeats (:func:`floor_steps`).
    Returns which compute figure the predictions use."""
    from dataclasses import replace as dc_replace

    from zerotopo.cost.planner import CostOptions, estimate

    floor = next((r for r in rows if r["kind"] == "floor" and r.get("step_time_s")), None)
    if floor is None:
        return f"topology file: {topo.device.peak_tflops:g} TFLOPS at efficiency 0.5"
    flops = shape.step_flops(opts.batch * opts.micro_batches, checkpoint_activations=opts.checkpoint)
    runs = floor_steps(floor, flops / start_flops_per_rank if start_flops_per_rank else None)
    tflops = flops / statistics.median(runs) / 1e12
    measured = dc_replace(topo, device=dc_replace(topo.device, peak_tflops=tflops))
    cost = CostOptions(micro_batch=opts.batch, grad_accum=opts.micro_batches, **wire_bytes(opts.dtype),
                       checkpoint_activations=opts.checkpoint, efficiency=1.0, memory_limit_bytes=opts.memory_cap_bytes,
                       **(measured_inputs or {}))  # fmt: skip
    for r in rows:
        m = meta[r["name"]]
        plan = m.get("plan_object")
        if plan is not None and r.get("step_time_s"):
            est = estimate(plan, shape, measured, cost, schedule=m.get("schedule_object"))
            r["predicted_step_time_s"] = predicted_step(est, opts)
    where = (
        f"median of its {len(runs)} runs, the start's included"
        if start_flops_per_rank
        else "median of its runs"
    )
    return f"measured by the no-comm row: {tflops * 1e3:.3f} GFLOPS per rank ({where})"


def floor_steps(floor: dict[str, Any], start_step_s: float | None = None) -> list[float]:
    """The ``no-comm`` row's step in each of its runs (each run's median step), with the run at start
    when given. On this project's 2-core VM a run's floor step moved by up to 20% from one repeat to the
    next (4.45-5.45 s in one run, 4.84-6.83 s in another), and every prediction moves with it: four runs
    of the same settings give a steadier median than three."""
    runs = list(floor.get("repeat_step_times_s") or [floor["step_time_s"]])
    return runs + ([start_step_s] if start_step_s else [])


def _mean_dict(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for d in dicts for k in d))  # tier order, innermost first
    return {k: sum(d.get(k, 0) for d in dicts) / len(dicts) for k in keys}


def assemble(
    opts: CompareOptions, per_rank: list[list[dict]], meta: dict[str, Any], tokens_per_step: int
) -> list[dict[str, Any]]:
    """Rank results -> one JSON row per requested row (rank 0's times, means and maxima over ranks)."""
    runs: dict[str, list[int]] = {}
    for i, r in enumerate(per_rank[0]):
        runs.setdefault(r["name"], []).append(i)
    rows = []
    for name in opts.rows:
        m = meta[name]
        source = m.get("same_as", name)
        ranks = [results[runs[source][0]] for results in per_rank]  # the first run
        r0 = ranks[0]
        row: dict[str, Any] = {"name": name, "kind": m["kind"], "plan": m["plan"]}
        if m.get("does_not_fit"):
            row.update(does_not_fit=True, predicted_memory_bytes=m["predicted_memory_bytes"], step_time_s=None,
                       final_loss=None, predicted_step_time_s=m["predicted"])  # fmt: skip
            rows.append(row)
            continue
        if m.get("same_as"):
            row["same_as"] = m["same_as"]
        if "error" in r0:
            row.update({"error": r0["error"], "step_time_s": None, "final_loss": None})
            rows.append(row)
            continue
        # each run's median step, then the median of those: the row's figure, with the runs' spread
        medians = [statistics.median(per_rank[0][i]["step_times_s"]) for i in runs[source]]
        step = statistics.median(medians)
        peaks = [
            None if None in (p := [results[i]["peak_memory_bytes"] for i in runs[source]]) else max(p)
            for results in per_rank
        ]
        final = sum(r["losses"][-1] for r in ranks) / len(ranks)
        row.update(
            {
                "degrees": r0["degrees"],
                "step_time_s": step,
                "step_times_s": r0["step_times_s"],
                "repeat_step_times_s": medians,
                "step_time_min_s": min(medians),
                "step_time_max_s": max(medians),
                "tokens_per_s": tokens_per_step / step,
                "predicted_step_time_s": m["predicted"],
                "predicted_tier_bytes": m.get("predicted_tier_bytes"),
                "ring_tier_bytes": m.get("ring_tier_bytes"),
                "ring_tier_messages": m.get("ring_tier_messages"),
                "tier_bytes_per_step": _mean_dict([r["tier_bytes"] for r in ranks]),
                "tier_payload_bytes_per_step": _mean_dict([r.get("tier_payload", {}) for r in ranks]),
                "peak_memory_bytes": max(peaks) if None not in peaks else None,
                "peak_memory_bytes_per_rank": peaks,
                "final_loss": final,
                "losses": [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(len(r0["losses"]))],
                "quantized": m["quantized"],
                "setup_s": r0["setup_s"],
                "predicted_memory_bytes": m.get("predicted_memory_bytes"),
                "replay_wait_s_per_step": r0.get("replay_wait_s"),
                **_clock_figures(ranks),
                # process groups alive on rank 0 in each run (its own: each run has fresh processes)
                "process_groups": [per_rank[0][i].get("process_groups") for i in runs[source]],
                # processor time of one step summed over the ranks (all of a rank's threads): on a machine
                # with fewer cores than ranks, what the step costs the cores, apart from waiting
                "cpu_s_per_step": sum(statistics.median(r["cpu_s"]) for r in ranks if r.get("cpu_s")),
            }
        )
        rows.append(row)
    return rows


def _clock_figures(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A row's device-clock figures, means over ranks, per step: seconds slept, of host activity the
    waits credited (:mod:`zerotopo_lab.bench.devicewait`'s note: the real arithmetic, the host work
    between kernels and the wait for a core), and that activity's share of the time slept plus it; and
    where the step's wall time went beside the device time charged (``clock_device_s_per_step``): the
    computing thread's time running or waiting for a core (:mod:`zerotopo_lab.bench.hosttime`) and
    asleep beyond the device time (``host_over_device_s_per_step``: what the clock's waits did not
    hide), the sleeps' overshoot, and the rest of its step, blocked on collectives and barriers
    (``blocked_s_per_step``). Empty off the clock."""
    slept = [r.get("clock_waited_s") or 0.0 for r in ranks]
    work = [r.get("clock_arithmetic_s") or 0.0 for r in ranks]
    if not any(slept) and not any(work):
        return {}

    def mean(key: str) -> float:
        return sum(r.get(key) or 0.0 for r in ranks) / len(ranks)

    s, w = mean("clock_waited_s"), mean("clock_arithmetic_s")
    host = mean("thread_cpu_s") + mean("run_delay_s")
    step = sum(statistics.median(r["step_times_s"]) for r in ranks) / len(ranks)
    return {
        "clock_slept_s_per_step": s,
        "clock_arithmetic_s_per_step": w,
        "arithmetic_fraction": w / (s + w),
        "clock_device_s_per_step": mean("clock_device_s"),
        "host_cpu_s_per_step": mean("thread_cpu_s"),
        "run_delay_s_per_step": mean("run_delay_s"),
        # the rank's other threads (its transport, the copy engine): their processor time and their
        # waits for a core, which delay a collective's hops
        "others_cpu_s_per_step": mean("others_cpu_s"),
        "others_run_delay_s_per_step": mean("others_run_delay_s"),
        "host_over_device_s_per_step": s + host - mean("clock_device_s"),
        "clock_overshoot_s_per_step": mean("clock_overshoot_s"),
        "blocked_s_per_step": step - s - mean("clock_overshoot_s") - host,
    }


def check_losses(rows: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(reference row, why the comparison is void or None). Each row's final loss must lie within the
    tolerance of the reference's: the first full-precision row that ran."""
    ran = [r for r in rows if r.get("final_loss") is not None and r.get("kind") != "floor"]
    exact = [r for r in ran if not r["quantized"]]
    if not ran:
        return None, "no row ran"
    ref = (exact or ran)[0]
    bad = []
    for r in ran:
        tol = loss_tolerance(r)
        delta = abs(r["final_loss"] - ref["final_loss"]) / max(abs(ref["final_loss"]), 1e-12)
        r["loss_rel_diff"] = delta
        r["loss_ok"] = delta <= tol
        if not r["loss_ok"]:
            bad.append(f"{r['name']} {r['final_loss']:.5f} ({delta:.2%} > {tol:.1%})")
    failed = [r["name"] for r in rows if r.get("error")]
    for r in rows:
        r.setdefault("loss_ok", r.get("final_loss") is not None)  # the floor row: not compared
    why = []
    if bad:
        why.append(f"final losses disagree with {ref['name']} {ref['final_loss']:.5f}: " + ", ".join(bad))
    if failed:
        why.append("rows failed: " + ", ".join(failed))
    return ref["name"], "; ".join(why) or None


def row_ratios(r: dict[str, Any], net: str) -> None:
    """A row's prediction over its median step, and its bytes sent across nodes (tier ``net``) over its
    schedule's ring accounting, set from the row's figures (``bench compare``, and ``bench scale --from``
    when it pools runs)."""
    if r.get("predicted_step_time_s") and r.get("step_time_s"):
        r["predicted_over_measured"] = r["predicted_step_time_s"] / r["step_time_s"]
    ring, sent = r.get("ring_tier_bytes"), r.get("tier_bytes_per_step")
    if ring and sent and ring.get(net) and net in sent:
        r["network_bytes_over_ring"] = sent[net] / ring[net]
        r["network_payload_over_ring"] = r["tier_payload_bytes_per_step"][net] / ring[net]
        messages = (r.get("ring_tier_messages") or {}).get(net)
        if messages:
            excess = r["tier_payload_bytes_per_step"][net] - ring[net]
            r["network_excess_bytes_per_message"] = excess / messages


def loss_tolerance(r: dict[str, Any]) -> float:
    """How far a row's final loss may lie from another's, relative: wider for a quantized row."""
    return QUANTIZED_RTOL if r.get("quantized") else EXACT_RTOL


def ratios(rows: list[dict[str, Any]], base: str = "zerotopo") -> dict[str, float]:
    """tokens/s of ``base`` over every other row's."""
    by = {r["name"]: r for r in rows if r.get("tokens_per_s") and r["kind"] != "floor"}
    if base not in by:
        return {}
    return {f"{base}/{n}": by[base]["tokens_per_s"] / r["tokens_per_s"] for n, r in by.items() if n != base}


def _check(opts: CompareOptions) -> None:
    for key in ("steps", "micro_batches", "batch", "repeat"):
        if getattr(opts, key) < 1:
            raise ConfigError(f"expected a positive number, got {getattr(opts, key)}", key=f"--{key}")
    if opts.regime not in REGIMES:
        raise ConfigError(f"unknown regime {opts.regime!r}; regimes are {', '.join(REGIMES)}", key="--regime")
    if opts.curves is not None and opts.curves not in CURVES:
        raise ConfigError(f"unknown curves {opts.curves!r}; choose {', '.join(CURVES)}", key="--curves")


def apply_regime(opts: CompareOptions, topo: Any, target: Any) -> tuple[CompareOptions, Regime | None]:
    """``opts`` with the settings :func:`zerotopo_lab.bench.regime.derive` gives for the target's ZeRO-3 R
    (``frontier-20b``: this machine's compute rate measured now; a built-in model gets the target's
    embedding-to-layer proportion, :func:`~zerotopo_lab.bench.regime.derived_vocab`, unless ``--vocab``
    says otherwise), and the derivation; ``comm-bound``: ``opts`` unchanged, None."""
    if opts.regime in ("comm-bound", "device-clock"):
        return opts, None
    from zerotopo.cost.planner import CostOptions, estimate
    from zerotopo_lab.bench import regime as R
    from zerotopo_lab.presets import resolve

    if opts.vocab is None and opts.model in MODELS:
        cfg, seq = model_config(opts)
        opts = replace(opts, vocab=R.derived_vocab(cfg.shape(seq).layer_params(), cfg.hidden_size))
    cfg, seq = model_config(opts)
    batch = max(1, -(-R.MIN_TOKENS // seq))
    cost_topo, measured = cost_inputs(opts, topo)
    target_bytes = R.target_zero3_memory()

    def cost(checkpoint: bool) -> Any:
        return CostOptions(micro_batch=batch, checkpoint_activations=checkpoint, **wire_bytes(opts.dtype))

    def cap_of(checkpoint: bool) -> tuple[float, float]:
        shape = replace(cfg, checkpoint_activations=checkpoint).shape(seq)
        need = estimate(resolve("zero3")[0], shape, cost_topo, cost(checkpoint)).memory.total
        return R.memory_cap(need, target_bytes), need

    flops = measure_compute(
        opts, topo, replace(cfg, checkpoint_activations=R.checkpointing(cap_of)), seq, batch
    )

    def replayed(checkpoint: bool) -> float:
        # zero3's replayed waits over its compute at the measured rate (the links do not change either)
        from zerotopo_lab.bench.replay import schedule_wait

        shape = replace(cfg, checkpoint_activations=checkpoint).shape(seq)
        machine = R.emulated_topology(cost_topo, opts.network_mbit, flops)
        est = estimate(resolve("zero3")[0], shape, machine, replace(cost(checkpoint), efficiency=1.0))
        replay = make_replay(str(opts.curves), shape, batch, checkpoint, flops, target, topo)
        return schedule_wait(est.schedule, replay) / est.time.compute_s

    reg = R.derive(target.zero3, flops, cfg, seq, cost_topo, cap_of, replayed if opts.curves else None,
                   **wire_bytes(opts.dtype), **measured)  # fmt: skip
    opts = replace(opts, batch=reg.batch, seq=seq, micro_batches=reg.micro_batches,
                   checkpoint=reg.checkpoint_activations, network_mbit=reg.network_mbit, node_uplink=True,
                   memory_cap_bytes=reg.memory_cap_bytes,
                   deepspeed_buckets=R.deepspeed_buckets(reg.layer_ratio))  # fmt: skip
    return opts, reg


def make_replay(
    curves: str,
    shape: Any,
    batch: int,
    checkpoint: bool,
    flops: float,
    target: Any,
    topo: Any,
    factor: float = 1.0,
) -> Replay:
    """The :class:`Replay` of ``--curves``: messages over the layer-size ratio, time scaled per layer
    (this machine's compute of a bench layer over the target's compute of one of its layers, both their
    share of a micro-batch: a bench collective stands for a target layer's), times ``factor``
    (:attr:`zerotopo_lab.bench.regime.Regime.replay_factor`)."""
    from zerotopo_lab.bench import regime as R

    bench_s = shape.step_flops(batch, checkpoint_activations=checkpoint) / flops * R.layer_share(shape)
    scale = factor * bench_s / (target.compute_per_micro_batch_s * target.layer_share)
    return Replay(curves, R.layer_ratio(shape), scale, topo.devices_per_node)


def with_replay(opts: CompareOptions, topo: Any, target: Any, reg: Regime | None) -> CompareOptions:
    """``opts`` carrying the :class:`Replay` of ``--curves`` (:func:`make_replay`; compute rate: the
    regime's, else measured now)."""
    if opts.curves is None or opts.replay is not None:  # the device clock sets its own
        return opts
    cfg, seq = model_config(opts)
    flops = reg.flops_per_rank if reg else measure_compute(opts, topo, cfg, seq, opts.batch)
    factor = reg.replay_factor if reg else 1.0
    replay = make_replay(
        opts.curves, cfg.shape(seq), opts.batch, opts.checkpoint, flops, target, topo, factor
    )
    return replace(opts, replay=replay)


@contextmanager
def cluster(opts: CompareOptions, topo: Any) -> Iterator[tuple[Any, dict[str, str], dict[str, float]]]:
    """The emulated cluster the ranks run on, unless ``opts.emulate`` is False: (network or None, the
    links' htb class of each tier, shaped rates in Mbit/s)."""
    if not opts.emulate:
        yield None, {}, {}
        return
    from zerotopo.launch.netem import HOW_TO_SKIP, available, emulated_cluster

    ok, why = available()
    if not ok:
        raise ZerotopoError(
            f"cannot emulate the cluster here ({why}); {HOW_TO_SKIP}: zerotopo bench compare --no-emulate"
        )
    with emulated_cluster(
        topo, network_mbit=opts.network_mbit, rates=opts.rates, delays_ms=opts.delays_ms,
        node_uplink=opts.node_uplink,
    ) as net:  # fmt: skip
        rates = dict(net.tier_rates_mbit)
        if net.node_uplink_mbit is not None:
            rates["uplink per node"] = net.node_uplink_mbit
        yield net, dict(net.tier_classes), rates


def _spawn(fn: Any, args: tuple, opts: CompareOptions, topo: Any, network: Any) -> list:
    from zerotopo.launch.spawn import spawn

    env = {"DS_ACCELERATOR": "cpu"}  # DeepSpeed's CPU accelerator (no CUDA here)
    return spawn(fn, topo.world_size, args=args, ranks_per_node=topo.devices_per_node, env=env,
                 timeout_s=opts.timeout_s, network=network)  # fmt: skip


def run_order(rows: int, repeat: int) -> list[tuple[int, int]]:
    """(repeat, row index) of every run in the order they run: every row, then every row again, each
    repeat starting ``rows / repeat`` rows further on: no row runs first (or last) every time, so a
    drift of the machine over the minutes of a run does not favour the rows early in the list (at 10
    rows and 3 repeats each row's mean place lies within 1.5 of the middle, where a fixed order spans
    0 to 9)."""
    return [(k, (k * rows // repeat + j) % rows) for k in range(repeat) for j in range(rows)]


def run_rows(
    opts: CompareOptions, topo: Any, specs: list[tuple[str, Any]], tier_classes: dict[str, str], network: Any
) -> list[list[dict[str, Any]]]:
    """Every run of every row, interleaved in :func:`run_order`, each in rank processes of its own:
    {rank: its results in run order}.

    A run's processes hold its own process groups alone. Rows run one after another in the same
    processes would carry every earlier row's groups, and an idle gloo group keeps a network loop
    thread that wakes every 10 ms: after 21 engine meshes a rank idled at 7-9% of a core (0.3% with
    one), so each row ran slower than the one before it and each run slower than the last (the first
    run was every row's fastest). Nor does a row inherit what an earlier one left in the process
    (allocator state, a library's patches)."""
    per_rank: list[list[dict[str, Any]]] = [[] for _ in range(topo.world_size)]
    order = run_order(len(specs), opts.repeat)
    for n, (k, i) in enumerate(order):
        name, plan = specs[i]
        print(f"run {n + 1}/{len(order)}: {name}", file=sys.stderr, flush=True)
        results = _spawn(_worker, (opts, [(k, name, plan)], tier_classes), opts, topo, network)
        for mine, got in zip(per_rank, results):
            mine.extend(got)
    return per_rank


#: Bench sequences per micro-batch per rank and their length under ``--regime device-clock`` (unless
#: given): the target's device time does not depend on them, the real arithmetic does.
CLOCK_BATCH = 1
CLOCK_SEQ = 64

#: Timed steps of :func:`measure_compute`'s floor run (after one warm-up step).
COMPUTE_STEPS = 3


def measure_compute(opts: CompareOptions, topo: Any, cfg: Any, seq: int, batch: int) -> float:
    """FLOP/s per rank of the compute floor: the ``no-comm`` row run once at start, its ranks spawned as
    the rows' are (no links shaped), one warm-up and :data:`COMPUTE_STEPS` timed steps of ``batch`` x
    ``seq`` tokens (one micro-batch, ``cfg``'s checkpointing, the run's dtype); the model's FLOPs over
    the median step. The run counts as one of the floor's when :func:`repredict` prices the rows after
    the run (at the median of the floor's runs), so the regime is derived at a rate the pricing
    shares. Forward and backward passes alone (what this timed before) leave out the floor's optimizer step, data and row overhead: they read
    1.25x and 0.99x the floor's later rate in two earlier runs (docs/bench.md, "Compute rate")."""
    run = floor_runs(opts, topo, cfg, seq, batch)[0]
    flops = cfg.shape(seq).step_flops(batch, checkpoint_activations=cfg.checkpoint_activations)
    return flops / statistics.median(run["step_times_s"])


def floor_runs(opts: CompareOptions, topo: Any, cfg: Any, seq: int, batch: int) -> list[dict[str, Any]]:
    """The start's run of the ``no-comm`` row that :func:`measure_compute` times: every rank's result
    (its ``step_times_s`` and processor seconds ``cpu_s`` per timed step), rank order."""
    print(f"measuring the compute rate: the {FLOOR_ROW} row on {topo.world_size} ranks", file=sys.stderr,
          flush=True)  # fmt: skip
    floor = replace(opts, batch=batch, seq=seq, micro_batches=1, warmup=1, steps=COMPUTE_STEPS,
                    checkpoint=cfg.checkpoint_activations, replay=None, profile_dir=None)  # fmt: skip
    runs = [r[0] for r in _spawn(_worker, (floor, [(0, FLOOR_ROW, None)], {}), opts, topo, None)]
    if "error" in runs[0]:
        raise ZerotopoError(
            f"the {FLOOR_ROW} row failed while measuring the compute rate: {runs[0]['error']}"
        )
    return runs


def _probe_worker(rank: int, world: int, opts: CompareOptions) -> list:
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.transport import probe

    mesh = build_mesh(load_topology(opts.topology, nodes=opts.nodes), get_preset("zero3"), topo_index=rank)
    return probe(mesh.group("grads"), world)


def measure_transport(opts: CompareOptions, topo: Any, network: Any) -> Any:
    """The ranks' transport cost on the links the rows will use (:mod:`zerotopo_lab.bench.transport`)."""
    from zerotopo_lab.bench.transport import fit

    return fit(_spawn(_probe_worker, (opts,), opts, topo, network), topo.world_size)


def with_transport(topo: Any, transport: Any) -> Any:
    """``topo`` with the device's transport cost set to ``transport``'s."""
    return replace(topo, device=replace(topo.device, **transport.device_fields()))


def priced(opts: CompareOptions, measure: Any = None) -> tuple[CompareOptions, Any, Any, Any, Any, Any, dict]:
    """``opts`` with its regime, clock and replay applied, and what the cost model prices the rows on:
    (opts, topology, target, regime derivation or None, clock settings or None, cost topology, measured
    cost inputs). ``measure``: the device clock's arithmetic rate (default: measured now on the ranks,
    :func:`zerotopo_lab.bench.clocked.measure_rate`)."""
    from zerotopo.placement.topology import load_topology

    _check(opts)
    topo = load_topology(opts.topology, nodes=opts.nodes)
    target = target_regime()
    opts, reg = apply_regime(opts, topo, target)
    opts, clocked = apply_clock(opts, topo, measure)
    opts = with_replay(opts, topo, target, reg)
    cfg, seq = model_config(opts)
    cost_topo, measured = cost_inputs(opts, topo)
    if clocked is not None:
        from zerotopo_lab.bench.clocked import cost_topology

        # priced on the target's device time and links as the clock dilates them, at efficiency 1
        cost_topo = cost_topology(clocked, cfg, seq, opts.batch, opts.micro_batches, opts.checkpoint,
                                  fast_links=opts.replay is not None)  # fmt: skip
        measured = {**measured, "default_bandwidth": False, "efficiency": 1.0}
    elif reg is not None:
        # priced on the links the regime set (the derivation's rates; latencies as calibrated), not on
        # the topology file's, which were measured at the comm-bound rates
        from zerotopo_lab.bench.regime import emulated_topology

        cost_topo = emulated_topology(cost_topo, opts.network_mbit, cost_topo.device.peak_tflops * 1e12)
        measured = {**measured, "default_bandwidth": False}  # the shipped table holds the comm-bound rates
    return opts, topo, target, reg, clocked, cost_topo, measured


def compare(opts: CompareOptions, *, command: str = "") -> dict[str, Any]:
    """Run every row on local ranks (on the emulated cluster unless ``opts.emulate`` is False) and
    return the report (see the module docstring)."""
    opts, topo, target, reg, clocked, cost_topo, measured = priced(opts)
    cfg, seq = model_config(opts)
    shape = cfg.shape(seq, name=opts.model)
    t0 = time.perf_counter()
    with cluster(opts, topo) as (network, tier_classes, rates):
        # on the clock a collective's processor time falls inside a device wait (devicewait's note)
        transport = None if clocked else measure_transport(opts, topo, network)
        if transport is not None:
            cost_topo = with_transport(cost_topo, transport)
        specs, meta = resolve_rows(opts, cost_topo, shape, measured)
        per_rank = run_rows(opts, topo, specs, tier_classes, network)
    wall = time.perf_counter() - t0
    tokens = topo.world_size * opts.micro_batches * opts.batch * seq
    rows = assemble(opts, per_rank, meta, tokens)
    # the regime's start run used the rows' batch, checkpointing and one micro-batch (apply_regime)
    if clocked is None:
        compute = repredict(rows, meta, opts, cost_topo, shape, measured, reg.flops_per_rank if reg else None)
    else:
        compute = f"the device clock: D {clocked.clock.dilation:.3g}, k {clocked.clock.scale:.3g}"
    reference, void = check_losses(rows)
    for r in rows:
        row_ratios(r, topo.network.name)
    report = {"command": command, "machine": f"{socket.gethostname()}, {os.cpu_count()} CPUs",
              "topology": topo.name, "world_size": topo.world_size, "emulated": opts.emulate,
              "tier_rates_mbit": rates}  # fmt: skip
    report.update(_settings(opts, cfg, shape, seq, tokens, topo.world_size))
    report.update(wall_s=wall, predicted_compute=compute, reference=reference, losses_agree=void is None,
                  cost_inputs=(opts.calibration or f"topologies/{topo.name}.yaml and its default bandwidth table")
                  + (", tiers at the regime's link rates" if reg is not None else ""),
                  void=void, transport=transport.to_dict() if transport else None)  # fmt: skip
    report.update(_verdicts(rows))
    report["regime"] = _regime_report(opts, target, reg, rows)
    if clocked is not None:
        report["device_clock"] = clocked.to_dict()
    report["rows"] = rows
    return report


def apply_clock(opts: CompareOptions, topo: Any, measure: Any = None) -> tuple[CompareOptions, Any]:
    """``device-clock``: ``opts`` on the emulated device clock and its settings
    (:func:`zerotopo_lab.bench.clocked.derive` with ``measure``, default
    :func:`~zerotopo_lab.bench.clocked.measure_rate`; a built-in model gets the target's
    embedding-to-layer proportion, as under ``frontier-20b``); other regimes: ``opts``, None."""
    if opts.regime != "device-clock":
        return opts, None
    from zerotopo_lab.bench import clocked
    from zerotopo_lab.bench.regime import derived_vocab

    if opts.vocab is None and opts.model in MODELS:
        cfg, seq = model_config(opts)
        opts = replace(opts, vocab=derived_vocab(cfg.shape(seq).layer_params(), cfg.hidden_size))
    cfg, seq = model_config(opts)
    return clocked.derive(opts, topo, cfg, seq, measure or clocked.measure_rate, opts.workload)


def _settings(
    opts: CompareOptions, cfg: Any, shape: Any, seq: int, tokens: int, world: int
) -> dict[str, Any]:
    model = {"name": opts.model, "parameters": shape.param_count(), "hidden": cfg.hidden_size,
             "layers": cfg.num_layers, "vocab": cfg.vocab_size, "seq": seq}  # fmt: skip
    return {
        "model": model,
        "dtype": opts.dtype,
        "micro_batch": opts.batch,
        "micro_batches": opts.micro_batches,
        "global_batch": world * opts.micro_batches * opts.batch,
        "tokens_per_step": tokens,
        "tokens_per_micro_batch_per_rank": opts.batch * seq,
        "checkpoint_activations": opts.checkpoint,
        "memory_cap_bytes": opts.memory_cap_bytes,
        "deepspeed_buckets": opts.deepspeed_buckets,
        "curves": opts.curves,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "repeat": opts.repeat,
        "lr": opts.lr,
    }


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The planner's pick, the fastest zerotopo row, and every row's tokens/s ratio to the best one."""
    zt = [r for r in rows if r["kind"] == "zerotopo" and r.get("tokens_per_s") and not r.get("same_as")]
    planner = next((r for r in rows if r["name"] == "planner"), None)
    best = max(zt, key=lambda r: r["tokens_per_s"])["name"] if zt else None
    return {
        "planner_pick": planner["plan"] if planner else None,
        "fastest_zerotopo_row": best,
        "ratios": ratios(rows),
        "ratios_to_best_zerotopo": ratios(rows, best) if best else {},
    }


def _regime_report(opts: CompareOptions, target: Any, reg: Regime | None, rows: list) -> dict[str, Any]:
    out = {
        "name": opts.regime,
        "target": target.description,
        "target_R": target.zero3,
        "target_R_deepspeed_zero3": target.deepspeed_zero3,
        "measured_R": measured_ratio(rows),
        "measured_R_repeats": measured_ratios(rows),
    }
    if reg is not None:
        out.update(predicted_R=reg.predicted_R, flops_per_rank=reg.flops_per_rank,
                   layer_ratio=reg.layer_ratio)  # fmt: skip
    if opts.replay is not None:
        out["replay"] = {"curves": opts.curves, "time_scale": opts.replay.scale,
                         "factor": reg.replay_factor if reg else 1.0,
                         "message_scale": 1 / opts.replay.layer_ratio}  # fmt: skip
    return out


# -- output -----------------------------------------------------------------------------------------


def _spread(r: dict[str, Any]) -> str:
    lo, hi = r.get("step_time_min_s"), r.get("step_time_max_s")
    return "-" if lo is None else f"{lo:.3f}-{hi:.3f}"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def _tiers(d: dict[str, float] | None) -> str:
    if not d:
        return "-"
    return " ".join(f"{k}:{v / 1e6:.2f}" for k, v in d.items())


def format_report(report: dict[str, Any]) -> str:
    """The report as a text table with its header and verdict."""
    m = report["model"]
    net = report["tier_rates_mbit"]
    shaped = ", ".join(f"{k} {v:g}" for k, v in net.items()) + " Mbit/s" if net else "not shaped"
    lines = [
        f"{report['topology']} ({report['world_size']} ranks, {shaped}); model {m['name']} "
        f"({m['parameters'] / 1e6:.2f}M parameters, seq {m['seq']}); {report['micro_batches']} micro-batches "
        f"x {report['micro_batch']} sequences per rank, global batch {report['global_batch']}, "
        f"{report['dtype']}, {report['steps']} timed steps after {report['warmup']}, "
        f"{report.get('repeat', 1)} runs per row (step s: median, min-max of the runs' medians)",
        "",
        f"{'row':<16} {'degrees':<26} {'step s':>7} {'min-max':>13} {'pred s':>7} {'tokens/s':>9} {'peak MiB':>8} "
        f"{'final loss':>10}  MB sent per rank per step by tier",
    ]
    for r in report["rows"]:
        if r.get("does_not_fit"):
            lines.append(f"{r['name']:<16} does not fit: {_mib(r['predicted_memory_bytes'])} MiB predicted")
            continue
        if r.get("error"):
            lines.append(f"{r['name']:<16} failed: {r['error']}")
            continue
        pred = r["predicted_step_time_s"]
        lines.append(
            f"{r['name']:<16} {r['degrees'][:26]:<26} {r['step_time_s']:>7.3f} "
            f"{_spread(r):>13} {'-' if pred is None else f'{pred:.3f}':>7} {r['tokens_per_s']:>9.0f} "
            f"{_mib(r['peak_memory_bytes']):>8} {r['final_loss']:>10.5f}  {_tiers(r['tier_bytes_per_step'])}"
            + (f"  (= {r['same_as']})" if r.get("same_as") else "")
        )
    lines.append("")
    regime = report.get("regime")
    if regime:
        lines += _regime_lines(report, regime)
    clock = report.get("device_clock")
    if clock:
        fractions = [
            r["arithmetic_fraction"] for r in report["rows"] if r.get("arithmetic_fraction") is not None
        ]
        lines.append(
            f"device clock: {clock['target']}, D {clock['dilation']:.3g}, k {clock['scale']:.3g}; "
            f"{clock['workload']}; real arithmetic {clock['predicted_arithmetic_fraction']:.1%} of the waited "
            "time predicted"
            + (f", {min(fractions):.1%}-{max(fractions):.1%} measured over the rows" if fractions else "")
        )
    lines.append(f"predictions: compute {report['predicted_compute']}")
    tr = report.get("transport")
    if tr:
        lines.append(
            f"transport (measured first, priced as compute lost): {tr['us_per_call']:g} us per call, "
            f"{tr['us_per_mb']:g} us per MB sent ({tr['ranks_per_core']:g} ranks per core)"
        )
    over = {
        r["name"]: (r["network_bytes_over_ring"], r.get("network_payload_over_ring"))
        for r in report["rows"]
        if r.get("network_bytes_over_ring")
    }
    if over:
        lines.append(
            "cross-node bytes, the links' counters (payload without TCP/IP headers in brackets) over the "
            "schedule's ring accounting (hop by hop, zerotopo_lab.bench.ringbytes): "
            + ", ".join(f"{k} {v:.3f}x" + ("" if p is None else f" ({p:.3f}x)") for k, (v, p) in over.items())
        )
    extra = {
        r["name"]: r["network_excess_bytes_per_message"]
        for r in report["rows"]
        if r.get("network_excess_bytes_per_message") is not None
    }
    if extra:
        lines.append(
            "cross-node payload beyond the schedule's bytes, per message the schedule sends across nodes: "
            + ", ".join(f"{k} {v:.0f} B" for k, v in extra.items())
        )
    if report["ratios"]:
        lines.append("tokens/s ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["ratios"].items()))
    if report["planner_pick"]:
        lines.append(
            f"planner's pick: {report['planner_pick']}; fastest zerotopo row: {report['fastest_zerotopo_row']}"
        )
    lines.append(
        f"losses agree with {report['reference']} (unquantized rows within {EXACT_RTOL:.1%}, quantized within "
        f"{QUANTIZED_RTOL:.0%})"
        if report["losses_agree"]
        else f"COMPARISON VOID: {report['void']}"
    )
    return "\n".join(lines)


def _repeats(ratios: list[float]) -> str:
    if len(ratios) < 2:
        return ""
    return f" (median of the repeats, {min(ratios):.2f} to {max(ratios):.2f})"


def _regime_lines(report: dict[str, Any], regime: dict[str, Any]) -> list[str]:
    got = regime["measured_R"]
    lines = [
        f"regime {regime.get('name', '?')}: R (ZeRO-3 communication / compute) target {regime['target_R']:.2f} "
        f"(DeepSpeed ZeRO-3 {regime['target_R_deepspeed_zero3']:.2f}; {regime['target']}), "
        + (f"emulation predicted {regime['predicted_R']:.2f}, " if "predicted_R" in regime else "")
        + "measured "
        + ("- (needs the no-comm and zero3 rows)" if got is None else f"{got:.2f}")
        + _repeats(regime.get("measured_R_repeats") or [])
    ]
    cap = report.get("memory_cap_bytes")
    lines.append(
        f"tokens per micro-batch per rank {report.get('tokens_per_micro_batch_per_rank')}, checkpointing "
        f"{'on' if report.get('checkpoint_activations') else 'off'}, memory cap "
        + ("none" if cap is None else f"{cap / 2**20:.0f} MiB per rank")
        + (
            f", compute {regime['flops_per_rank'] / 1e9:.2f} GFLOPS per rank"
            if "flops_per_rank" in regime
            else ""
        )
        + (f", DeepSpeed buckets {report['deepspeed_buckets']}" if report.get("deepspeed_buckets") else "")
    )
    if "replay" in regime:
        rp = regime["replay"]
        lines.append(
            f"curve replay {rp['curves']}: messages x{rp['message_scale']:.0f}, times x{rp['time_scale']:.3g} "
            f"(of which x{rp.get('factor', 1.0):.2f} meets the target R; the predictions include each schedule's "
            "replayed waits)"
        )
    return lines


def plot(report: dict[str, Any], path: str) -> None:
    """A PNG: tokens/s per row (measured bars, the cost model's prediction as a marker) beside the MB
    each rank sent per step across every tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r.get("tokens_per_s")]
    names = [r["name"] for r in rows]
    colors = {"zerotopo": "tab:blue", "deepspeed": "tab:orange", "fsdp2": "tab:green"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = range(len(rows))
    ax1.bar(x, [r["tokens_per_s"] for r in rows], color=[colors.get(r["kind"], "gray") for r in rows])
    pred = [(i, report["tokens_per_step"] / r["predicted_step_time_s"]) for i, r in enumerate(rows)
            if r.get("predicted_step_time_s")]  # fmt: skip
    if pred:
        ax1.scatter([p[0] for p in pred], [p[1] for p in pred], marker="_", s=400, color="black",
                    label="cost model")  # fmt: skip
        ax1.legend()
    ax1.set_xticks(list(x), names, rotation=35, ha="right")
    ax1.set_ylabel("tokens/s (whole job)")
    ax1.set_title(
        f"{report['topology']}, model {report['model']['name']}, {report['micro_batches']} micro-batches"
    )
    tiers = sorted({t for r in rows for t in r["tier_bytes_per_step"]}, key=list(report["tier_rates_mbit"]).index
                   if report["tier_rates_mbit"] else None)  # fmt: skip
    bottom = [0.0] * len(rows)
    for tier in tiers:
        vals = [r["tier_bytes_per_step"].get(tier, 0) / 1e6 for r in rows]
        ax2.bar(x, vals, bottom=bottom, label=tier)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_xticks(list(x), names, rotation=35, ha="right")
    ax2.set_ylabel("MB sent per rank per step (shaped links)")
    if tiers:
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CompareOptions()
    p.add_argument(
        "--regime",
        choices=REGIMES,
        default="frontier-20b",
        help="frontier-20b (default): tokens, checkpointing, link rate and memory cap derived so ZeRO-3's "
        "communication/compute ratio matches NeoX-20B on 48 Frontier nodes, a node's ranks sharing one "
        "uplink; comm-bound: model small, 2 x 4 micro-batches, 50 Mbit/s per rank link (ZeRO-3 ~20x comm-bound); "
        "device-clock: every unit, optimizer step and quantizer kernel waits NeoX-20B's time on an MI250X GCD "
        "times a dilation D, links at Frontier's bandwidth x k / D (zerotopo_lab.bench.clocked)",
    )
    p.add_argument(
        "--curves",
        choices=tuple(CURVES),
        help="each collective also waits the time the shipped Frontier curve gives at 48 nodes, scaled "
        "to this machine (zerotopo_lab.bench.replay)",
    )
    p.add_argument(
        "--dtype",
        choices=tuple(PRECISIONS),
        help="weights, gathers and gradient reductions: bf16 (default for frontier-20b; the arithmetic runs "
        "in fp32, zerotopo_lab.bench.precision) or fp32 (default for comm-bound)",
    )
    add_clock_arguments(p)
    p.add_argument("--topology", default=d.topology, help=f"topology (default {d.topology})")
    p.add_argument("--nodes", type=int, help="emulated nodes (default: the topology's)")
    p.add_argument(
        "--model",
        help=f"built-in benchmark model ({', '.join(MODELS)}; default: wide for frontier-20b, {d.model} for "
        "comm-bound) or a NeoX YAML / configs name",
    )
    p.add_argument("--rows", default=",".join(d.rows), help="comma-separated rows (default: all)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"timed steps per row (default {d.steps})")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"untimed steps first (default {d.warmup})")
    p.add_argument(
        "--micro-batches",
        type=int,
        help=f"comm-bound: per step (default {d.micro_batches}); device-clock: per step per rank, each "
        "standing for one NeoX-20B micro-batch (default 1); derived otherwise",
    )
    p.add_argument(
        "--batch",
        type=int,
        help=f"comm-bound: sequences per micro-batch per rank ({d.batch}; derived otherwise)",
    )
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    p.add_argument("--vocab", type=int, help="vocabulary of a NeoX YAML model (default 1024)")
    p.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate (default {d.lr:g})")
    p.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help=f"runs of every row, interleaved; figures are medians with min-max (default {DEFAULT_REPEAT})",
    )
    p.add_argument(
        "--no-emulate",
        action="store_true",
        help="run on plain loopback (no namespaces, tiers unshaped, no per-tier bytes); no root needed",
    )
    p.add_argument(
        "--network-mbit",
        type=float,
        help=f"comm-bound: network tier rate per rank, Mbit/s; inner tiers at Frontier's ratios above it "
        f"(default {d.network_mbit:g}: package 800, node 200)",
    )
    p.add_argument("--shape", default="", help="per-tier rate overrides, e.g. package=1000,node=250")
    _output_arguments(p, d)


def _output_arguments(p: argparse.ArgumentParser, d: CompareOptions) -> None:
    """Where the report goes, and the run's limits and pricing inputs."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON report instead of the table, and nothing else on stdout (the ranks' output "
        "goes to --log)",
    )
    p.add_argument(
        "--log", metavar="FILE", help="with --json: where the ranks' output goes (default: a temp file)"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument("--plot", metavar="PNG", help="write a bar chart (tokens/s, bytes per tier) to PNG")
    p.add_argument(
        "--profile", metavar="DIR", help="profile one extra step per row on rank 0 (torch.profiler) into DIR"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.timeout_s,
        help="seconds one run's ranks may take before they are killed",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="price the predictions with this `zerotopo calibrate` file (tiers, curves, overlap) instead "
        "of the topology file and its shipped table",
    )


def add_clock_arguments(p: argparse.ArgumentParser) -> None:
    """``--arithmetic-share`` and ``--deepspeed-buckets`` (``bench compare --regime device-clock`` and
    ``bench scale``)."""
    from zerotopo_lab.bench import clock as C

    share = C.ARITHMETIC_SHARE
    p.add_argument(
        "--arithmetic-share",
        type=float,
        metavar="S",
        help="device-clock: the most of a step's waited time the real arithmetic may take; D follows from it "
        f"(default {share:g} up to {C.HALF_SHARE_RANKS} ranks, {share / 2:g} up to {C.SHARE_RANKS}, "
        f"{share / 2:g} x {C.SHARE_RANKS} / ranks beyond: a smaller share, a larger D, a longer run)",
    )
    p.add_argument(
        "--dilation",
        type=float,
        metavar="D",
        help="device-clock: run at this D instead of planning it from the arithmetic rate measured at start "
        "(e.g. an earlier run's D, printed in its report, so that `bench scale --from` can pool both runs' "
        "repeats); the arithmetic's share of the waited time is then printed, not planned",
    )
    p.add_argument(
        "--deepspeed-buckets",
        choices=("default", "target"),
        default="default",
        help="device-clock: DeepSpeed's stage-3 prefetch and reduce buckets and persistence threshold as "
        "DeepSpeed ships them (default; they hold the whole bench model, so DeepSpeed gathers it in one call "
        "a step) or scaled by the clock's k (target: a bench layer is the same part of a bucket as a NeoX-20B "
        "layer of the default one, so DeepSpeed prefetches module by module as at the target's size)",
    )


def target_buckets_from_args(args: argparse.Namespace) -> bool:
    """``--deepspeed-buckets target``."""
    return getattr(args, "deepspeed_buckets", "default") == "target"


def share_from_args(args: argparse.Namespace) -> float | None:
    """``--arithmetic-share``, checked: a share in (0, 1], or None for the default."""
    share = getattr(args, "arithmetic_share", None)
    if share is not None and not 0 < share <= 1:
        raise ConfigError(f"expected a share in (0, 1], got {share}", key="--arithmetic-share")
    return share


def dilation_from_args(args: argparse.Namespace) -> float | None:
    """``--dilation``, checked: D of at least 1 (the clock never runs faster than the device), not with
    ``--arithmetic-share`` (which plans D), or None for a planned D."""
    D = getattr(args, "dilation", None)
    if D is None:
        return None
    if not 1 <= D < float("inf"):
        raise ConfigError(f"expected a dilation of at least 1, got {D}", key="--dilation")
    if getattr(args, "arithmetic_share", None) is not None:
        raise ConfigError(
            "--arithmetic-share plans D and --dilation gives it; give one of them", key="--dilation"
        )
    return D


def options_from_args(args: argparse.Namespace) -> CompareOptions:
    from zerotopo.launch.netem import parse_rates

    rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
    if not rows:
        raise ConfigError("no rows given", key="--rows")
    if args.warmup < 0:
        raise ConfigError(f"expected 0 or more, got {args.warmup}", key="--warmup")
    if not 1 <= getattr(args, "repeat", 1) <= 100:
        raise ConfigError(f"expected 1 to 100, got {args.repeat}", key="--repeat")
    d = CompareOptions()
    regime = getattr(args, "regime", "comm-bound")
    derived = regime != "comm-bound"
    clock = regime == "device-clock"
    for key in ("network_mbit",) if clock else ("batch", "micro_batches", "network_mbit"):
        if derived and getattr(args, key, None) is not None:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{regime} derives {flag}; give --regime comm-bound to set it", key=flag)
    share = share_from_args(args)
    if share is not None and not clock:
        raise ConfigError("only --regime device-clock has a dilation to plan", key="--arithmetic-share")
    dilation = dilation_from_args(args)
    if dilation is not None and not clock:
        raise ConfigError("only --regime device-clock runs on a dilated clock", key="--dilation")
    if target_buckets_from_args(args) and not clock:
        raise ConfigError(
            "only --regime device-clock scales DeepSpeed's buckets by k (frontier-20b scales them by the "
            "layer ratio already)",
            key="--deepspeed-buckets",
        )
    if clock and args.shape:
        raise ConfigError("device-clock shapes every tier from the target's links", key="--shape")
    nodes = getattr(args, "nodes", None)
    if nodes is not None and not 1 <= nodes <= 64:
        raise ConfigError(f"expected 1 to 64 emulated nodes, got {nodes}", key="--nodes")
    model = args.model or ("wide" if derived else d.model)
    if clock:  # the device time is the target's: the real arithmetic only needs to be small
        d = replace(d, batch=CLOCK_BATCH, micro_batches=1, seq=CLOCK_SEQ)
    return replace(
        d,
        regime=regime,
        curves=getattr(args, "curves", None),
        topology=args.topology,
        model=model,
        rows=rows,
        steps=args.steps,
        warmup=args.warmup,
        micro_batches=args.micro_batches or d.micro_batches,
        batch=args.batch or d.batch,
        seq=args.seq or d.seq,
        vocab=args.vocab,
        nodes=nodes,
        lr=args.lr,
        emulate=not args.no_emulate,
        network_mbit=args.network_mbit or d.network_mbit,
        rates=parse_rates(args.shape),
        timeout_s=args.timeout,
        profile_dir=os.path.abspath(args.profile) if args.profile else None,
        calibration=args.calibration,
        repeat=getattr(args, "repeat", DEFAULT_REPEAT),
        dtype=getattr(args, "dtype", None) or ("bf16" if derived else "fp32"),
        arithmetic_share=share,
        dilation=dilation,
        target_buckets=target_buckets_from_args(args),
    )


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    command = "zerotopo " + " ".join(sys.argv[1:]) if sys.argv[1:] else "zerotopo bench compare"
    report = emit(args, lambda: compare(opts, command=command), plot, format_report)
    return 0 if report["losses_agree"] else 1


def report_json(report: dict[str, Any]) -> str:
    """A bench report as its JSON text (what ``--json`` prints and ``-o`` writes)."""
    return json.dumps(report, indent=1, default=str)


def write_report(path: str, report: dict[str, Any]) -> None:
    """Write a bench report's JSON to ``path`` (``-o FILE``)."""
    with open(path, "w") as f:
        f.write(report_json(report) + "\n")


def emit(
    args: argparse.Namespace,
    measure: Callable[[], dict[str, Any]],
    draw: Callable[[dict[str, Any], str], Any],
    text_of: Callable[[dict[str, Any]], str],
    ranks: bool = True,
) -> dict[str, Any]:
    """Run ``measure`` and hand its report on as a bench command's flags say: ``--json`` prints the JSON
    alone on stdout (the ranks' output goes to ``--log`` or a new log file, named on stderr; ``ranks``
    False: ``measure`` starts none and prints nothing, so no log), ``-o`` writes it to a file, ``--plot``
    draws it; otherwise ``text_of`` prints the table."""
    from zerotopo_lab.bench.quiet import log_path, stdout_to

    if args.json and ranks:
        log = getattr(args, "log", None) or log_path()
        print(f"# rank output: {log}", file=sys.stderr)
        with stdout_to(log):
            report = measure()
    else:
        report = measure()
    if args.output:
        write_report(args.output, report)
    if args.plot:
        draw(report, args.plot)
    print(report_json(report) if args.json else text_of(report))
    return report
