"""The regime a benchmark runs in: R, ZeRO-3's communication time over its compute time.

A ratio between plans depends on how communication-bound the run is (DESIGN.md, "Benchmarking in the
regime users run"), so ``bench compare`` states R twice: the target's, from the cost model for the
workload the benchmark stands for (NeoX-20B on 48 Frontier nodes at its configured micro-batch, the
shipped RCCL curves), and the one it measured (the ``zero3`` row's step beyond the ``no-comm`` row's,
over the ``no-comm`` row's: CPU ranks run their collectives on the thread that computes, so that
difference is the row's communication time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TARGET_MODEL = "configs/neox-20b.yml"
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


def target_regime(
    model: str = TARGET_MODEL, topology: str = TARGET_TOPOLOGY, nodes: int = TARGET_NODES
) -> TargetRegime:
    """R of ``model`` on ``nodes`` nodes of ``topology`` with the topology's shipped curves, at the
    config's micro-batch, accumulation, checkpointing and gradient width (as ``zerotopo plan``)."""
    from zerotopo.config.model_files import load_model
    from zerotopo.cost.planner import CostOptions, estimate
    from zerotopo.cost.presets import resolve
    from zerotopo.placement.topology import load_topology

    shape, neox = load_model([model], None)
    topo = load_topology(topology, nodes=nodes)
    micro = neox.train_micro_batch_size_per_gpu or 1
    opts = CostOptions(
        micro_batch=micro,
        grad_accum=neox.gradient_accumulation_steps or 1,
        checkpoint_activations=bool(neox.checkpoint_activations),
        grad_dtype=neox.grad_dtype,
    )

    def ratio(name: str) -> float:
        t = estimate(resolve(name)[0], shape, topo, opts).time
        return t.comm_s / t.compute_s

    return TargetRegime(
        f"{shape.name} on {nodes} {topology} nodes, micro-batch {micro}, shipped curves",
        ratio("zero3"),
        ratio("deepspeed-zero3"),
    )


def measured_ratio(rows: list[dict[str, Any]]) -> float | None:
    """The ``zero3`` row's communication time over the ``no-comm`` row's step (None without both)."""
    by = {r["name"]: r.get("step_time_s") for r in rows}
    floor, zero3 = by.get("no-comm"), by.get("zero3")
    if not floor or not zero3:
        return None
    return (zero3 - floor) / floor
