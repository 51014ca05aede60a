"""DeepSpeed's step schedule as the cost model prices it: a :class:`~zerotopo.placement.schedule.ScheduleModel`
beside the engine's, emitting the same :class:`~zerotopo.placement.schedule.StepSchedule`.

[Note: DeepSpeed's schedule] The engine gathers one flat unit per layer; DeepSpeed ZeRO-3 gathers each
submodule's parameters (:func:`module_units`), prefetches while the elements in flight stay under a bucket,
reduces gradients in buckets and, for ZeRO-1/2, all-gathers the updated parameters in buckets at the step
end. Its hpZ copy keeps the parameters' width, and on gloo its gradient reduce-scatter
(``reduce_scatter_tensor``) runs as a full all-reduce. Each of these is a knob of :class:`DeepSpeedSchedule`
and a hook of :class:`DeepSpeedBuilder`; the presets at DeepSpeed's defaults are in
:mod:`zerotopo_lab.presets`.

[Note: DeepSpeed's coalesced prefetch] Once its trace is complete, DeepSpeed's
``PartitionedParameterCoordinator.fetch_sub_module`` runs at every module's pre-forward hook, the root
module's first: it gathers the module's own parameters if none is in flight, waits for them, and then
prefetches from its recorded order while fewer than ``stage3_prefetch_bucket_size`` elements are
queued, all of them in one ``all_gather_coalesced`` call. A bucket larger than several modules makes one
call of them, waited for in full by the first (:func:`fetch_calls`). Traced on the bench's 8 ranks
(docs/bench_model_gap.md): the timed steps' forward is one all-gather of every parameter (4,232,832
elements) issued by the root module and waited for before the embedding computes.

[Note: DeepSpeed's hpZ forward] DeepSpeed's ``all_gather_coalesced`` gathers a parameter from its hpZ
secondary tensor, within the secondary group, whenever the tensor exists, forward or backward. The
tensor is made when a fetched parameter is released (partitioned again) and dropped at the optimizer
step (``invalidate_secondary_tensor``). So in a step of M micro-batches only the first micro-batch's
forward gathers over the job and the other M - 1 forwards gather within the node
(:attr:`DeepSpeedSchedule.hpz_forward`, each unit's ``first_micro_forward``). The bench's global batch
(48 micro-batches a rank at 2 nodes) counted it on its links: hpZ's cross-node bytes a step 0.674 of
ZeRO-3's, which is one gather of the model over the job and 48 gradient reductions over it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from zerotopo.cost.time import RuntimeCosts
from zerotopo.placement.codecs import PlanCodecs
from zerotopo.placement.schedule import Collective, ScheduleBuilder, Unit, UnitSteps
from zerotopo.placement.shape import ModelShape

#: Host seconds stage 3 adds per module per step (benchmarks/deepspeed_host_cost.py, 256 modules).
DS_HOST_S_PER_MODULE = 426e-6
#: ``PartitionedParameterCoordinator.__max_ongoing_fetch_events``.
DS_FETCH_WINDOW = 2

#: DeepSpeed stage 3's fixed costs (:mod:`zerotopo_lab.presets`' note).
DEEPSPEED_RUNTIME = RuntimeCosts(
    host_s_per_unit=DS_HOST_S_PER_MODULE, fetch_window=DS_FETCH_WINDOW, scale_gather=True
)


class DeepSpeedBuilder(ScheduleBuilder):
    """The engine's builder with DeepSpeed's buckets, hpZ width and gloo reduce-scatter (module note)."""

    options: DeepSpeedSchedule

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.backward_gather = self.options.backward_gather
        self.context["reduce"] = (*self.context["reduce"], self.options.reduce_scatter_all_reduce)

    def make_codecs(self, widths: dict[str, int]) -> PlanCodecs:
        codecs = super().make_codecs(widths)
        if self.options.secondary_param_dtype and self.plan.secondary_dtype != "int8":
            # the hpZ copy keeps the parameters' width
            return dataclasses.replace(codecs, secondary=codecs.param)
        return codecs

    def _reduce(self, n: int) -> tuple[Collective, ...]:
        out = super()._reduce(n)
        if not self.options.reduce_scatter_all_reduce:
            return out
        # an all-reduce: the reduce-scatter's bytes, then as many again
        return tuple(
            dataclasses.replace(c, op="all_reduce", bytes_sent=2 * c.bytes_sent)
            if c.op == "reduce_scatter"
            else c
            for c in out
        )

    def reductions(
        self, sizes: list[int]
    ) -> tuple[dict[int, tuple[Collective, ...]], dict[int, tuple[Collective, ...]]]:
        """DeepSpeed reduces the bucket before a gradient that would overflow it joins, and the remainder
        after the last one (backward order); the cross-replica reduction in the last backward is per
        bucket, beside the bucket's own reduction (DeepSpeed ZeRO-1/2 reduce their buckets at the
        accumulation boundary, MiCS all-reduces each bucket's shard across replicas after reducing it
        within the group)."""
        limit = self.options.reduce_bucket_elems
        if limit is None:
            return super().reductions(sizes)
        reduces: dict[int, tuple[Collective, ...]] = {}
        bucket_replicas: dict[int, tuple[Collective, ...]] = {}
        bucket = 0
        for i in reversed(range(len(sizes))):
            out: tuple[Collective, ...] = ()
            rep: tuple[Collective, ...] = ()
            if bucket and bucket + sizes[i] > limit:
                out, rep, bucket = self.reduce(bucket), self.replica(bucket), 0
            bucket += sizes[i]
            if i == 0:
                out, rep, bucket = out + self.reduce(bucket), rep + self.replica(bucket), 0
            reduces[i] = out
            bucket_replicas[i] = rep
        return reduces, bucket_replicas

    def prefetch_depths(self, units: list[Unit], reverse: bool) -> list[int]:
        """DeepSpeed issues prefetches while the elements in flight stay under the bucket (at least one)."""
        limit = self.options.prefetch_bucket_elems
        if limit is None:
            return super().prefetch_depths(units, reverse)
        order = units[::-1] if reverse else units
        out = []
        for i in range(len(order)):
            k, inflight = 0, 0
            for u in order[i + 1 :]:
                if k >= 1 and inflight + u.gathered > limit:
                    break
                k += 1
                inflight += u.gathered
            out.append(k)
        return out[::-1] if reverse else out

    def forward_calls(self, steps: list[UnitSteps], gathered: list[int]) -> list[UnitSteps]:
        """With ``coalesce_prefetch``, the forward gathers as DeepSpeed's prefetch issues them (module
        note): each call on the first unit it gathers, issued at its issuer's fetch. With
        ``hpz_forward`` and an hpZ copy, the first micro-batch gathers over the parameters' group and the
        later ones over the copy's (module note)."""
        bucket = self.options.prefetch_bucket_elems
        coalesce = self.options.coalesce_prefetch and bucket is not None and self.d.params > 1
        hpz = self.options.hpz_forward and self.d.secondary is not None and self.d.params > 1
        if not coalesce and not hpz:
            return steps
        elems = [g if u.forward else 0 for u, g in zip(steps, gathered)]  # each unit's own call
        depth = [u.prefetch for u in steps]
        if coalesce:
            elems, depth = [0] * len(steps), [0] * len(steps)
            for issuer, members in fetch_calls(gathered, bucket):
                elems[members[0]] = sum(gathered[j] for j in members)
                if issuer >= 0:
                    depth[issuer] = max(depth[issuer], members[0] - issuer)

        def calls(kind: str, size: int, codec) -> list[tuple[Collective, ...]]:
            return [self.gather("forward", kind, size, codec, n) if n else () for n in elems]

        forward = calls("params", self.d.params, self.codecs.gather)
        if not hpz:
            return [dataclasses.replace(u, forward=f, prefetch=k) for u, f, k in zip(steps, forward, depth)]
        later = calls("secondary", self.d.secondary, self.codecs.secondary)
        return [
            dataclasses.replace(u, forward=f, first_micro_forward=f0, prefetch=k)
            for u, f, f0, k in zip(steps, later, forward, depth)
        ]

    def unit_end_param_gather(self, n: int) -> tuple[Collective, ...]:
        return () if self.options.allgather_bucket_elems is not None else super().unit_end_param_gather(n)

    def extra_step_end(self, sizes: list[int]) -> list[Collective]:
        """The post-step parameter all-gather at the step end in calls of ``allgather_bucket_elems``
        elements (none unless the options bucket it)."""
        if self.options.allgather_bucket_elems is None or self.in_fwd:
            return []
        total = sum(sizes)
        k = max(1, self.d.optim // self.d.params)
        per = -(-self.options.allgather_bucket_elems // k) * k  # whole per-rank chunks
        full, rest = divmod(total, per)
        return [*self.param_gather(per) * full, *(self.param_gather(rest) if rest else ())]


@dataclass(frozen=True)
class DeepSpeedSchedule:
    """DeepSpeed's schedule knobs (its config keys named beside each); a
    :class:`~zerotopo.placement.schedule.ScheduleModel`."""

    name: str = "deepspeed"
    reduce_bucket_elems: int | None = None
    """Gradient elements per reduction (``reduce_bucket_size``); None: one per module."""
    prefetch_bucket_elems: int | None = None
    """Elements gathered ahead (``stage3_prefetch_bucket_size``); None: ``plan.prefetch`` modules."""
    persistence_threshold: int = 0
    """Parameters with fewer elements stay whole on every rank and are never gathered
    (``stage3_param_persistence_threshold``)."""
    step_end_in_backward: bool = False
    """Each cross-replica gradient reduction runs in the boundary backward (ZeRO-1/2 with
    ``overlap_comm``, MiCS); False: all of them after the backward (stage 3's step)."""
    param_gather_in_forward: bool = False
    """The post-step parameter all-gather stays in flight into the next forward (DeepSpeed: never)."""
    secondary_param_dtype: bool = True
    """A plain secondary partition (the hpZ copy) keeps the parameters' width; False: bf16."""
    allgather_bucket_elems: int | None = None
    """Parameter elements per post-step all-gather call (ZeRO-1/2 ``allgather_bucket_size``); None: one
    call per module."""
    reduce_scatter_all_reduce: bool = False
    """The gradient reduce-scatter runs as a full all-reduce: DeepSpeed calls torch's
    ``reduce_scatter_tensor``, which gloo implements so (an all-reduce's ``2(d-1)/d`` of the message per
    rank where a ring reduce-scatter sends ``(d-1)/d``; docs/cost-model.md)."""
    backward_gather: bool = True
    """A sharded module is gathered again before its backward; False: the forward's gathered weights stay
    until the backward (stage 3 on the bench: its coordinator keeps every parameter its prefetcher
    fetched until the parameter's last use, so after the first step nothing is gathered in the backward)."""
    hpz_forward: bool = False
    """Once a module's hpZ copy exists, every gather of it reads the copy over its group: the forwards of
    a step's later micro-batches as well as the backwards (DeepSpeed 0.19.8's ``all_gather_coalesced``
    takes the secondary tensor whenever the parameter has one; it is made at the module's first
    release in a step and dropped at the optimizer step, so the first micro-batch's forward gathers
    over the job); False: only the backward gathers read it. The cost presets keep False (their
    published figures); the bench's DeepSpeed rows, read from the installed DeepSpeed, run True."""
    coalesce_prefetch: bool = False
    """A prefetch spanning several modules is one call, waited for in full by its first module
    (DeepSpeed's ``all_gather_coalesced``; module note); False: one call per module. The cost presets
    keep False (their published figures); the bench's DeepSpeed rows, traced, run True."""
    description: str = field(default="", compare=False)

    builder: ClassVar[type[ScheduleBuilder]] = DeepSpeedBuilder
    unit_layers: ClassVar[None] = None

    def __post_init__(self) -> None:
        for k in ("reduce_bucket_elems", "prefetch_bucket_elems", "allgather_bucket_elems"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{k} must be a positive integer or None, got {v!r}")

    @property
    def runtime(self) -> RuntimeCosts | None:
        """Stage 3's fixed costs when it fetches modules (:data:`DEEPSPEED_RUNTIME`); none for ZeRO-1/2."""
        return DEEPSPEED_RUNTIME if self.prefetch_bucket_elems is not None else None

    @property
    def hold_gathered(self) -> bool:
        return not self.backward_gather

    @property
    def per_unit(self) -> bool:
        return self.reduce_bucket_elems is None and self.allgather_bucket_elems is None

    @property
    def units_key(self) -> tuple:
        return ("module", self.persistence_threshold)

    def units(self, shape: ModelShape) -> list[Unit]:
        """DeepSpeed's modules of ``shape`` (:func:`module_units`)."""
        return module_units(shape, self.persistence_threshold)

    def with_unit_layers(self, k: int) -> DeepSpeedSchedule:
        raise ValueError(f"{self.name} gathers per module: it has no layers per unit to choose ({k} given)")


def fetch_calls(gathered: list[int], bucket: int) -> list[tuple[int, list[int]]]:
    """DeepSpeed's forward gather calls in a step with a complete trace (module note): per call, the unit
    whose fetch issues it (-1: the root module, before the first unit) and the units it gathers, in
    order. ``gathered``: each unit's gathered elements (0: nothing gathered, never fetched). Every fetch
    prefetches at least the next unit queued, so no unit is left to a fetch of its own."""
    queue = [i for i, g in enumerate(gathered) if g > 0]
    calls: list[tuple[int, list[int]]] = []
    head = 0
    for issuer in range(-1, len(gathered)):
        start, n = head, 0
        while head < len(queue) and n < bucket:
            n += gathered[queue[head]]
            head += 1
        if head > start:
            calls.append((issuer, queue[start:head]))
    return calls


def module_units(shape: ModelShape, persistence_threshold: int = 0) -> list[Unit]:
    """One unit per weight matrix, as DeepSpeed ZeRO-3 gathers submodules: per layer the QKV projection,
    the attention output and each MLP matrix (two, or three when gated); biases and norms ride along with
    the next weight matrix and are gathered unless below ``persistence_threshold`` elements (then never
    gathered). Parameters and FLOPs come from the shape's unit description."""
    seq = shape.seq_length
    layer = shape.layer_unit()
    attention_f = seq * shape.attention_flops()

    def unit(name: str, params: list[int], matmul: int, extra: float = 0.0) -> Unit:
        gathered = sum(p for p in params if p >= persistence_threshold)
        return Unit(name, sum(params), gathered, 2.0 * seq * matmul + extra)

    by_module: dict[str, list] = {}
    for p in layer.params:
        by_module.setdefault(p.module, []).append(p)
    # each norm (weight and bias as one) rides with the matrix that reads its output
    mlp = [m for m in by_module if m.startswith("mlp.")]
    norm_of = {"attention.query_key_value": "input_layernorm", mlp[0]: "post_attention_layernorm"}
    units = []
    for module, params in by_module.items():
        if module.endswith("layernorm"):
            continue
        sizes = [p.numel for p in params]
        if module in norm_of:
            sizes.append(sum(p.numel for p in by_module[norm_of[module]]))
        matmul = sum(p.numel for p in params if p.matmul)
        # attention scores and context (the s²h term) run between QKV and the output projection
        extra = attention_f if module == "attention.query_key_value" else 0.0
        units.append(unit(_MODULE_UNIT_NAMES.get(module, module), sizes, matmul, extra))
    head = shape.head_unit()
    emb = shape.embedding_params()
    head_f = seq * head.flops_per_token
    head_params = [sum(p.numel for p in head.params if not p.matmul)] + [
        p.numel for p in head.params if p.matmul
    ]
    return (
        [Unit("embedding", emb, emb if emb >= persistence_threshold else 0)]
        + units * shape.num_layers
        + [unit("head", head_params, 0, head_f)]
    )


_MODULE_UNIT_NAMES = {
    "attention.query_key_value": "layer.qkv",
    "attention.dense": "layer.dense",
    "mlp.dense_h_to_4h": "layer.mlp_in",
    "mlp.dense_4h_to_h": "layer.mlp_out",
    "mlp.w1": "layer.mlp_in",
    "mlp.w3": "layer.mlp_up",
    "mlp.w2": "layer.mlp_out",
}
