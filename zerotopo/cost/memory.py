"""Device memory per state for a plan: the model states of Chen et al., "Lins: Reducing Communication
Overhead of ZeRO for Efficient LLM Training" (IWQoS 2024, doi:10.1109/IWQoS61813.2024.10682856) §IV-D plus
buffers and activations.

``params + secondary + grads + optim`` is the model-state memory ``D_modelstate``; ``buffers`` are the
full-unit temporaries (gathered weights of the unit being computed and of those prefetched, and one full
unit gradient before its reduce-scatter) and ``activations`` the NeoX activation memory
(``D_activation``; Korthikanti et al. 2022), so ``total`` is Lins' ``D_total``.

With ``padded=True`` (the engine's buffers) each unit is padded by :func:`zerotopo.placement.layout.padded_numel`
and every figure is a whole number of bytes. With ``padded=False`` the exact fractions are kept, so the
papers' closed forms (``2ψ/(N·P)``, ``ψ/8`` ...) come out exactly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from zerotopo.placement import volume
from zerotopo.placement.layout import padded_numel
from zerotopo.placement.plan import Plan
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

GIB = 1024**3


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device, by what they hold."""

    params: float
    """Primary parameter shard (``param_bytes`` per element)."""
    secondary: float
    """Secondary partition for the backward gather (bf16, or int8 values + fp32 block scales)."""
    grads: float
    """Gradient shard accumulated over micro-batches (``grad_bytes`` per element)."""
    optim: float
    """Optimizer shard: fp32 master weights and Adam moments (``optim_bytes_per_param`` per element)."""
    buffers: float
    """Full-unit temporaries of the backward: gathered weights (current + prefetched), and the unit's
    gradient twice (autograd's ``.grad`` in the parameter width and the flat reduce-scatter input)."""
    activations: float
    """Activations of one micro-batch (all layers, or checkpoints + one layer when recomputing)."""
    step_buffers: float = 0
    """The optimizer step's fp32 copy of every optimizer chunk of the gradient, where the step makes one
    (gradient shards narrower than fp32, or a reduce-scatter into a separate optimizer chunk)."""

    @property
    def model_states(self) -> float:
        return self.params + self.secondary + self.grads + self.optim

    @property
    def total(self) -> float:
        """The peak: model states plus the larger of the backward's and the step's temporaries."""
        return self.model_states + max(self.buffers + self.activations, self.step_buffers)

    def as_dict(self) -> dict[str, float]:
        return {
            "params": self.params,
            "secondary": self.secondary,
            "grads": self.grads,
            "optim": self.optim,
            "buffers": self.buffers,
            "activations": self.activations,
            "step_buffers": self.step_buffers,
            "total": self.total,
        }


def activation_bytes(shape: ModelShape, micro_batch: int, *, checkpoint_activations: bool) -> float:
    """Activation memory of one micro-batch: every layer's activations, or with checkpointing one
    layer's (recomputed during its backward) plus each layer's 16-bit input ``s·b·h·2``."""
    per_layer = shape.activation_bytes_per_layer(micro_batch)
    if not checkpoint_activations:
        return per_layer * shape.num_layers
    checkpoints = shape.num_layers * shape.seq_length * micro_batch * shape.hidden_size * 2
    return per_layer + checkpoints


def memory_per_device(
    unit_numels: list[int],
    topology: Topology,
    plan: Plan,
    *,
    param_bytes: int = 2,
    grad_bytes: int | None = None,
    optim_bytes_per_param: int = 12,
    padded: bool = True,
    micro_batch: int = 1,
    shape: ModelShape | None = None,
    checkpoint_activations: bool = True,
) -> MemoryBreakdown:
    """Memory one device holds for ``plan`` (see the module note); ``shape`` adds activations.

    ``grad_bytes`` follows ``plan.grad_dtype`` when not given: 4 for fp32 gradient shards (``fp32`` or
    unset), ``param_bytes`` for ``param`` (the 2 bytes the papers' tables count).
    ``optim_bytes_per_param`` is 12 (fp32 master + Adam m and v) as in both papers.
    """
    if not unit_numels:
        raise ValueError("a model needs at least one unit")
    if grad_bytes is None:
        grad_bytes = param_bytes if getattr(plan, "grad_dtype", None) == "param" else 4
    widths = (param_bytes, grad_bytes, optim_bytes_per_param)
    activations = (micro_batch, shape, checkpoint_activations)
    return _memory(unit_numels, plan, plan.degrees(topology), *widths, padded, *activations)


def _memory(
    unit_numels,
    plan,
    d,
    param_bytes,
    grad_bytes,
    optim_bytes_per_param,
    padded,
    micro_batch,
    shape,
    checkpoint_activations,
    *,
    hold_gathered: bool = False,
) -> MemoryBreakdown:
    # layers repeat: cost each distinct unit size once
    counts = Counter(unit_numels)

    # padded sizes split evenly over every degree: whole numbers, no fractions needed
    sizes = {n: padded_numel(n, d) if padded else Fraction(n) for n in counts}
    size = sizes.__getitem__

    def div(x: Fraction | int, k: int) -> Fraction | int:
        return x // k if padded else x / k

    def total(per_unit) -> Fraction | int:
        return sum(per_unit(size(n)) * k for n, k in counts.items())

    params = total(lambda x: div(x, d.params)) * param_bytes
    grads = total(lambda x: div(x, d.grads)) * grad_bytes
    optim = total(lambda x: div(x, d.optim)) * optim_bytes_per_param
    secondary = Fraction(0)
    if d.secondary is not None:
        s, block = d.secondary, plan.quant_block
        if plan.secondary_dtype == "bf16":
            secondary = total(lambda x: div(x, s) * 2)
        elif padded:
            secondary = total(lambda x: volume.int8_payload(x // s, block))
        else:
            # exact fraction: one byte per value plus a 4-byte scale per block, no rounding
            secondary = total(lambda x: x / s + x / s * volume.SCALE_BYTES / block)
    largest = max(size(n) for n in counts)
    gathers = d.params > 1 or d.secondary is not None
    # gathered weights of the unit in use plus those prefetched; the unit's gradient as autograd leaves it
    # (parameter width) and as the flat reduce-scatter input (gradient width) exist together while it is
    # flattened (on gloo the ring's staged copy then replaces autograd's, freed by then)
    # (every unit's under ``hold_gathered``: a schedule without backward gathers,
    # ``DeepSpeedSchedule.backward_gather`` False as DeepSpeed stage 3 ran on the bench, keeps what it
    # gathered in the forward until the unit's backward)
    held = total(lambda x: x) if hold_gathered else largest * (1 + plan.prefetch)
    buffers = (held * param_bytes if gathers else 0) + largest * (param_bytes + grad_bytes)
    # the block quantizer's wire buffers of the largest unit (its fused kernels need no more than these):
    # the int8 gathered message before it is dequantized, the int4 all-to-all's send and receive buffers
    if padded:
        block = plan.quant_block
        if plan.quantize_weights or (d.secondary is not None and plan.secondary_dtype == "int8"):
            buffers += volume.int8_payload(largest, block)
        if plan.quantize_grads and d.grads > 1:
            buffers += 2 * volume.int4_payload(largest, block)
    # the cross-replica reduce-scatter's optimizer chunks (gradient width): the engine starts them in the
    # last backward (runtime.py, [Note: last backward]), so they coexist with its buffers and activations
    if plan.grad_reduce != "allreduce" and d.optim > d.grads:
        buffers += total(lambda x: div(x, d.optim)) * grad_bytes
    # the step's fp32 upcast of 2-byte gradient chunks (an fp32 chunk is used in place)
    step_buffers = total(lambda x: div(x, d.optim)) * 4 if grad_bytes != 4 else 0
    activations = (
        activation_bytes(shape, micro_batch, checkpoint_activations=checkpoint_activations) if shape else 0.0
    )

    def out(x: Fraction | int) -> float:
        return x if isinstance(x, int) else int(x) if x.denominator == 1 else float(x)

    return MemoryBreakdown(
        params=out(params),
        secondary=out(secondary),
        grads=out(grads),
        optim=out(optim),
        buffers=out(buffers),
        activations=activations,
        step_buffers=out(step_buffers),
    )


def max_model_params(
    topology: Topology,
    plan: Plan,
    *,
    param_bytes: int = 2,
    grad_bytes: int | None = None,
    optim_bytes_per_param: int = 12,
    memory_bytes: float | None = None,
) -> float:
    """The largest parameter count whose model states (parameters, secondary, gradients, optimizer; no
    buffers, no activations, as Xu et al. (arXiv:2501.04266) §I counts) fit ``memory_bytes`` (the device's
    memory by
    default). Model states grow linearly with the parameter count, so this is the device memory over the
    model-state bytes per parameter."""
    probe = 10**9
    m = memory_per_device(
        [probe],
        topology,
        plan,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optim_bytes_per_param=optim_bytes_per_param,
        padded=False,
    )
    limit = topology.device.memory_gib * GIB if memory_bytes is None else memory_bytes
    return limit * probe / m.model_states
