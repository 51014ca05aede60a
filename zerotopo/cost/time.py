"""Predicted step time: alpha-beta collectives on the tier they cross, NeoX FLOPs, and their overlap.

A collective over a group of ``d`` ranks whose outermost tier is ``T`` takes
``steps·latency(T) + bytes_sent / bandwidth(T)`` with ``steps = d-1`` for ring all-gather,
reduce-scatter and all-to-all and ``2(d-1)`` for all-reduce (papers/004 §IV-A). ``bandwidth(T)`` is the
per-device figure when every device talks at once, so concurrent groups already share it.

Compute is ``ModelShape.step_flops`` at ``peak × efficiency``. [Note: overlap] The engine prefetches the
next unit's all-gather and runs reduce-scatters on a side stream, so with ``prefetch >= 1`` a phase of a
micro-batch (forward, backward) takes ``max(compute, communication)`` plus what cannot hide: the first
forward unit's gather (nothing to compute yet) and the last backward unit's gradient reduce-scatter
(nothing left to compute). With ``prefetch = 0`` they add up. The step-end reductions, the post-step
parameter all-gather and the scalar all-reduces run after the last backward and do not overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotopo.cost.comm import CollectiveCost
from zerotopo.models.shape import ModelShape
from zerotopo.topology import Topology


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step and the rates that follow from it."""

    step_time_s: float
    compute_s: float
    """Compute of all micro-batches at ``peak × efficiency``."""
    comm_s: float
    """All communication if nothing overlapped."""
    exposed_comm_s: float
    """Communication not hidden behind compute."""
    tokens_per_s: float
    """Tokens per second of the whole job."""
    tflops_per_device: float
    """Hardware TFLOPS per device (recomputed forward counted, as NeoX logs it)."""
    mfu: float
    """Model FLOPs (forward + backward, no recompute) over peak; 0 when the peak is unknown."""


def collective_time(c: CollectiveCost, topology: Topology) -> float:
    """Seconds of one call of ``c`` under the alpha-beta model."""
    bw = topology.bandwidth_gbps(c.tier) * 1e9
    return c.latency_steps * topology.latency_us(c.tier) * 1e-6 + c.bytes_sent / bw


def _per_micro_batch(
    costs: list[CollectiveCost], phase: str, micro_batches: int, topology: Topology
) -> float:
    return sum(collective_time(c, topology) * c.count for c in costs if c.phase == phase) / micro_batches


def step_time(
    costs: list[CollectiveCost],
    topology: Topology,
    shape: ModelShape,
    *,
    micro_batch: int,
    micro_batches: int,
    prefetch: int = 1,
    efficiency: float = 0.5,
    checkpoint_activations: bool = True,
    edge: list[CollectiveCost] | None = None,
) -> StepTime:
    """Step time of the schedule ``costs`` (from :func:`~zerotopo.cost.comm.comm_per_step`).

    ``edge`` holds the first forward unit's collectives for one micro-batch
    (:func:`~zerotopo.cost.comm.edge_costs`): its all-gather opens the forward and its gradient
    reduce-scatter closes the backward, so neither overlaps with compute. A device with unknown peak
    (0 TFLOPS) is costed on communication alone.
    """
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    samples = micro_batch * micro_batches
    flops = shape.step_flops(samples, checkpoint_activations=checkpoint_activations)
    peak = topology.device.peak_tflops * 1e12
    compute = flops / (peak * efficiency) if peak > 0 else 0.0
    # forward is one pass of the ×3 (×4 with recompute) total
    fwd_share = 1.0 / (4.0 if checkpoint_activations else 3.0)
    c_fwd = compute * fwd_share / micro_batches
    c_bwd = compute * (1 - fwd_share) / micro_batches
    m_fwd = _per_micro_batch(costs, "forward", micro_batches, topology)
    m_bwd = _per_micro_batch(costs, "backward", micro_batches, topology) + _per_micro_batch(
        costs, "grad_reduce", micro_batches, topology
    )
    head = sum(collective_time(c, topology) for c in edge or [] if c.phase == "forward")
    tail = sum(collective_time(c, topology) for c in edge or [] if c.phase == "grad_reduce")
    if prefetch >= 1:
        t_fwd = head + max(c_fwd, m_fwd - head)
        t_bwd = max(c_bwd, m_bwd - tail) + tail
    else:
        t_fwd, t_bwd = c_fwd + m_fwd, c_bwd + m_bwd
    step_end = sum(collective_time(c, topology) * c.count for c in costs if c.phase not in _OVERLAPPABLE)
    total = micro_batches * (t_fwd + t_bwd) + step_end
    all_comm = sum(collective_time(c, topology) * c.count for c in costs)
    tokens = samples * shape.seq_length * topology.world_size
    model_flops = shape.step_flops(samples, checkpoint_activations=False)
    return StepTime(
        step_time_s=total,
        compute_s=compute,
        comm_s=all_comm,
        exposed_comm_s=total - compute,
        tokens_per_s=tokens / total if total > 0 else 0.0,
        tflops_per_device=flops / total / 1e12 if total > 0 and peak > 0 else 0.0,
        mfu=model_flops / total / peak if total > 0 and peak > 0 else 0.0,
    )


_OVERLAPPABLE = ("forward", "backward", "grad_reduce")
