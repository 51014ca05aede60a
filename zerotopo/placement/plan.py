"""Sharding plans: one shard degree per model state.

A *degree* ``d`` means: groups of ``d`` ranks with consecutive topological index hold one full copy of
that state between them. A plan names degrees for the primary parameters (``params``), an optional
``secondary`` partition used by the backward all-gather (ZeRO++ hpZ; Xu et al., "Scaling Large Language
Model Training on Frontier with Low-Bandwidth Partitioning" (arXiv:2501.04266)), the gradients
(``grads``) and the optimizer states (``optim``). Degrees nest, ``params | grads | optim | world``: each
rank keeps only the gradients and optimizer states of parameters it holds (the dependency rule of
Xu et al. (arXiv:2501.04266) §V and Chen et al., "Lins: Reducing Communication Overhead of ZeRO for
Efficient LLM Training" (IWQoS 2024, doi:10.1109/IWQoS61813.2024.10682856) §IV-B). Degrees may be numbers
or tier names (``package``, ``node``,
``world``, ``inner`` for the innermost tier), resolved against a :class:`~zerotopo.placement.topology.Topology`.

Every placement of DeepSpeed ZeRO-1/2/3, ZeRO++, MiCS, FSDP/HSDP and Lins is a :class:`Plan`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from zerotopo.errors import ConfigError, PlanError, short
from zerotopo.placement.numbers import PROBLEMS, number
from zerotopo.placement.topology import Topology
from zerotopo.placement.yamlio import load_yaml_file, load_yaml_text

SYNC_MODES = ("event", "host")
#: The stock (racy) ordering of ZeRO++ hpZ: never a plan option, only the engine's test and benchmark hook
#: ``zerotopo.engine.debug.DebugOptions(unordered_secondary=True)``, so no user can select a racy schedule.
RACY_SYNC = "none"
SECONDARY_DTYPES = ("bf16", "int8")
GRAD_REDUCE_MODES = ("reduce_scatter", "allreduce")
GRAD_DTYPES = ("fp32", "param")

Degree = int | str

#: Bounds of the integer plan fields (checked before anything is sized by them).
MAX_QUANT_BLOCK = 1 << 20
MAX_PREFETCH = 64


@dataclass(frozen=True)
class Degrees:
    """A plan's degrees resolved to numbers for one world size."""

    params: int
    grads: int
    optim: int
    world: int
    secondary: int | None = None

    @property
    def backward_gather(self) -> int:
        """Group size of the backward all-gather: the secondary partition's, else the primary's."""
        return self.secondary if self.secondary is not None else self.params


@dataclass(frozen=True)
class Plan:
    """Where each model state lives, and how it moves. Degrees are numbers or tier names."""

    name: str = "custom"
    """A label for tables and logs."""
    params: Degree = "world"
    """Shard degree of the primary (trainable, fp16/bf16/fp32) parameters."""
    grads: Degree = "world"
    """Shard degree of the gradients (accumulated in fp32 over micro-batches)."""
    optim: Degree = "world"
    """Shard degree of the optimizer states: fp32 master copy, Adam moments."""
    secondary: Degree | None = None
    """Degree of the secondary weight partition for the backward pass (None: gather from ``params``)."""
    secondary_dtype: str = "bf16"
    """Storage of the secondary partition: ``bf16`` (ZeRO++ hpZ) or ``int8`` (Xu et al.
    (arXiv:2501.04266))."""
    quantize_weights: bool = False
    """int8 block quantization of the forward weight all-gather (ZeRO++ qwZ)."""
    quantize_grads: bool = False
    """int4 all-to-all gradient reduce-scatter (ZeRO++ qgZ)."""
    quant_block: int = 256
    """Elements per quantization block (one fp32 scale each)."""
    prefetch: int = 1
    """Units whose all-gather is issued ahead of the one being computed."""
    sync: str = "event"
    """Stream ordering of the secondary partition: ``event`` (zerotopo) or ``host`` (DeepSpeed's host
    block). The stock hpZ race is not a plan option (see :data:`RACY_SYNC`)."""
    grad_reduce: str = "reduce_scatter"
    """Cross-replica gradient reduction: ``reduce_scatter`` inside the optimizer group then all-reduce
    across optimizer replicas, or ``allreduce`` of the whole gradient shard then select (the papers)."""
    grad_dtype: str | None = None
    """Gradients' width, in the per-micro-batch reduction and in the accumulated shard: ``fp32``, or
    ``param`` (the parameter dtype, 2 bytes for fp16/bf16, as DeepSpeed ZeRO and Xu et al.
    (arXiv:2501.04266) Tables V-VI).
    Unset: the caller's default (``parallelize``: fp32; ``zerotopo train``/``plan`` on a NeoX config:
    DeepSpeed's, whose ``data_types.grad_accum_dtype`` defaults to the model dtype, i.e. ``param``)."""
    description: str = field(default="", compare=False)

    def degrees(self, topology: Topology) -> Degrees:
        """Resolve and validate the degrees for ``topology``; raises :class:`PlanError` naming the rule."""
        world = topology.world_size
        try:
            p, g, o = (topology.degree(x) for x in (self.params, self.grads, self.optim))
            s = topology.degree(self.secondary) if self.secondary is not None else None
        except ConfigError as exc:
            raise PlanError(f"plan {self.name!r} on topology {topology.name!r}: {exc}") from None
        d = Degrees(params=p, grads=g, optim=o, world=world, secondary=s)
        validate_degrees(d, plan_name=self.name, topology=topology)
        self._validate_options()
        return d

    def _validate_options(self) -> None:
        checks = [
            (
                self.sync in SYNC_MODES,
                f"sync must be one of {', '.join(SYNC_MODES)}, got {self.sync!r}"
                + (
                    " (the unordered stock hpZ schedule races and is not a plan option; it exists only as "
                    "the engine's test hook zerotopo.engine.debug.DebugOptions(unordered_secondary=True))"
                    if self.sync == RACY_SYNC
                    else ""
                ),
            ),
            (
                self.secondary_dtype in SECONDARY_DTYPES,
                f"secondary dtype must be one of {', '.join(SECONDARY_DTYPES)}, got {self.secondary_dtype!r}",
            ),
            (
                self.grad_reduce in GRAD_REDUCE_MODES,
                f"grad_reduce must be one of {', '.join(GRAD_REDUCE_MODES)}, got {self.grad_reduce!r}",
            ),
            (
                self.grad_dtype is None or self.grad_dtype in GRAD_DTYPES,
                f"grad_dtype must be one of {', '.join(GRAD_DTYPES)}, got {self.grad_dtype!r}",
            ),
            (
                isinstance(self.quant_block, int) and self.quant_block >= 2 and self.quant_block % 2 == 0,
                f"quant_block must be an even integer >= 2, got {self.quant_block!r}",
            ),
            (
                isinstance(self.prefetch, int) and self.prefetch >= 0,
                f"prefetch must be >= 0, got {self.prefetch!r}",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise PlanError(f"plan {self.name!r}: {msg}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("description")
        if self.secondary is None:
            d.pop("secondary_dtype")
        return d

    def label(self, topology: Topology | None = None) -> str:
        """A compact description: ``p=2 s=8/int8 g=8 o=16 qw qg``."""
        if topology is not None:
            d = self.degrees(topology)
            p, s, g, o = d.params, d.secondary, d.grads, d.optim
        else:
            p, s, g, o = self.params, self.secondary, self.grads, self.optim
        return _label(p, s, self.secondary_dtype, g, o, self.quantize_weights, self.quantize_grads)


def _label(p: Any, s: Any, dtype: str, g: Any, o: Any, qw: bool, qg: bool) -> str:
    """:meth:`Plan.label` of these fields."""
    parts = [f"p={p}"]
    if s is not None:
        parts.append(f"s={s}/{dtype}")
    parts += [f"g={g}", f"o={o}"]
    if qw:
        parts.append("qw8")
    if qg:
        parts.append("qg4")
    return " ".join(parts)


def validate_degrees(d: Degrees, *, plan_name: str = "plan", topology: Topology | None = None) -> None:
    """Check that every degree divides the world and that ``params | grads | optim`` nest."""
    where = f"plan {plan_name!r}" + (f" on {topology.name} x{topology.nodes} nodes" if topology else "")
    named = [("params", d.params), ("grads", d.grads), ("optim", d.optim)]
    if d.secondary is not None:
        named.append(("secondary", d.secondary))
    for name, v in named:
        if not isinstance(v, int) or v < 1:
            raise PlanError(f"{where}: {name} degree must be a positive integer, got {v!r}")
        if d.world % v:
            raise PlanError(
                f"{where}: {name} degree {v} does not divide the world size {d.world}; "
                f"use a divisor of {d.world} (e.g. {', '.join(map(str, divisors(d.world)))})"
            )
    if d.grads % d.params:
        raise PlanError(
            f"{where}: degrees must nest params | grads | optim, but params={d.params} does not divide "
            f"grads={d.grads}; a rank must hold the gradients of parameters it holds (Lins, IWQoS 2024, §IV-B)"
        )
    if d.optim % d.grads:
        raise PlanError(
            f"{where}: degrees must nest params | grads | optim, but grads={d.grads} does not divide "
            f"optim={d.optim}; a rank's optimizer shard must lie inside its gradient shard"
        )


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (trial division up to its square root)."""
    small, large = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    return small + large[::-1]


# -- presets ----------------------------------------------------------------------------------------

PRESETS: dict[str, Plan] = {
    "ddp": Plan(
        "ddp", params=1, grads=1, optim=1, description="plain data parallelism: everything replicated"
    ),
    "zero1": Plan("zero1", params=1, grads=1, optim="world", description="ZeRO-1: optimizer states sharded"),
    "zero2": Plan("zero2", params=1, grads="world", optim="world", description="ZeRO-2: + gradients sharded"),
    "zero3": Plan(
        "zero3",
        params="world",
        grads="world",
        optim="world",
        description="ZeRO-3 / FSDP full shard: everything sharded over the job",
    ),
    "zeropp": Plan(
        "zeropp",
        params="world",
        grads="world",
        optim="world",
        secondary="node",
        secondary_dtype="bf16",
        quantize_weights=True,
        quantize_grads=True,
        description="DeepSpeed ZeRO++: hpZ secondary copy per node, int8 weights, int4 gradients",
    ),
    "mics": Plan(
        "mics",
        params="node",
        grads="node",
        optim="node",
        description="MiCS: every state sharded inside a node, replicated across nodes",
    ),
    "hsdp": Plan(
        "hsdp",
        params="node",
        grads="node",
        optim="node",
        description="FSDP hybrid shard: shard inside the node, replicate across nodes",
    ),
    "zerotopo": Plan(
        "zerotopo",
        params="inner",
        grads="node",
        optim="world",
        secondary="node",
        secondary_dtype="int8",
        quantize_weights=True,
        quantize_grads=True,
        description="Xu et al.: weights on a package's GCDs, int8 secondary per node, "
        "gradients per node, optimizer states over the job",
    ),
    "zerotopo-pkg": Plan(
        "zerotopo-pkg",
        params="inner",
        grads="node",
        optim="world",
        secondary="inner",
        secondary_dtype="int8",
        quantize_weights=True,
        quantize_grads=True,
        description="zerotopo with the int8 secondary partition per package",
    ),
}


def get_preset(name: str, source: str = "plan") -> Plan:
    if not isinstance(name, str):
        raise ConfigError(
            f"a preset is a name ({', '.join(PRESETS)}), found {short(name)} ({type(name).__name__})",
            source=source,
            key="preset",
        )
    key = name.strip().lower().replace("_", "-")
    aliases = {
        "zero++": "zeropp",
        "zero-pp": "zeropp",
        "fsdp": "zero3",
        "zero-3": "zero3",
        "zero-topo": "zerotopo",
    }
    key = aliases.get(key, key)
    if key not in PRESETS:
        raise ConfigError(
            f"unknown plan preset {short(name)}; presets are {', '.join(PRESETS)}, or give a plan YAML file",
            key="plan",
        )
    return PRESETS[key]


_PLAN_FIELDS = {f for f in Plan.__dataclass_fields__ if f != "description"}


def _integer(value: Any, source: str, key: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer plan value; ConfigError naming ``key`` when it is not one, or not in ``[lo, hi]``."""
    out_of_range = f"expected {lo} to {hi}, found {{found}}"
    return number(
        value,
        integer=True,
        whole_floats=False,
        minimum=lo,
        maximum=hi,
        messages={
            **dict.fromkeys(PROBLEMS, "expected an integer, found {found}"),
            "low": out_of_range,
            "high": out_of_range,
        },
        error=lambda message: ConfigError(message, source=source, key=key),
    )


def plan_from_mapping(raw: Mapping[str, Any], source: str = "plan") -> Plan:
    """Build a plan from YAML/dict: ``preset:`` (optional base) plus any :class:`Plan` field.

    ``secondary`` may be a degree or ``{degree: node, dtype: int8}``.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a plan must be a preset name or a mapping, found {short(raw)}", source=source)
    raw = {str(k).replace("-", "_"): v for k, v in raw.items()}
    for k in ("name", "sync", "secondary_dtype", "grad_reduce", "grad_dtype"):
        if k in raw and not isinstance(raw[k], str):
            raise ConfigError(
                f"expected a string, found {short(raw[k])} ({type(raw[k]).__name__})", source=source, key=k
            )
    if "name" in raw and not raw["name"].strip():
        raise ConfigError("expected a non-empty name", source=source, key="name")
    base = (
        get_preset(raw.pop("preset"), source)
        if "preset" in raw
        else Plan(name=str(raw.get("name", "custom")))
    )
    sec = raw.get("secondary")
    if isinstance(sec, Mapping):
        unknown = set(sec) - {"degree", "dtype"}
        if unknown:
            raise ConfigError(
                f"unknown key {short(sorted(map(str, unknown))[0])}; expected degree, dtype",
                source=source,
                key="secondary",
            )
        raw["secondary"] = sec.get("degree")
        if "dtype" in sec:
            raw["secondary_dtype"] = sec["dtype"]
    unknown = sorted(set(raw) - _PLAN_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown key {short(unknown[0])}; plan keys are preset, {', '.join(sorted(_PLAN_FIELDS))}",
            source=source,
            key=unknown[0],
        )
    for k in ("quantize_weights", "quantize_grads"):
        if k in raw and not isinstance(raw[k], bool):
            raise ConfigError(f"expected true or false, found {short(raw[k])}", source=source, key=k)
    for k in ("params", "grads", "optim", "secondary"):
        v = raw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
            raise ConfigError(f"expected a number or a tier name, found {short(v)}", source=source, key=k)
        if isinstance(v, int) and v < 1:
            raise ConfigError(f"expected a positive degree, found {v}", source=source, key=k)
    for k, lo, hi in (("quant_block", 2, MAX_QUANT_BLOCK), ("prefetch", 0, MAX_PREFETCH)):
        if k in raw:
            raw[k] = _integer(raw[k], source, k, lo, hi)
    plan = replace(base, **raw)
    if "name" not in raw and base.name != "custom" and set(raw) - {"sync", "prefetch", "grad_reduce"}:
        plan = replace(plan, name=f"{base.name}*")
    try:
        plan._validate_options()
    except PlanError as exc:
        raise ConfigError(str(exc), source=source) from None
    return plan


def plan_from_deepspeed(zero: Mapping[str, Any], source: str = "zero_optimization") -> Plan:
    """Map a DeepSpeed ``zero_optimization`` block onto a plan.

    ``stage`` 0-3 picks ddp/zero1/zero2/zero3; ``zero_hpz_partition_size`` > 1 adds a bf16 secondary
    partition of that degree; ``zero_quantized_weights`` and ``zero_quantized_gradients`` turn on the
    int8/int4 collectives; ``mics_shard_size`` > 0 shards every state over that many ranks.
    """
    if not isinstance(zero, Mapping):
        raise ConfigError(f"expected a mapping, found {short(zero)}", source=source)
    z = {str(k).replace("-", "_"): v for k, v in zero.items()}
    stage = z.get("stage", 0)
    # bool is an int and 3.0 == 3 in Python: only a real integer names a stage.
    if type(stage) is not int or stage not in (0, 1, 2, 3):
        raise ConfigError(
            f"stage must be 0, 1, 2 or 3, found {short(stage)} ({type(stage).__name__}; an integer)",
            source=source,
            key="stage",
        )
    plan = get_preset(["ddp", "zero1", "zero2", "zero3"][stage])
    hpz = z.get("zero_hpz_partition_size", 1) or 1
    mics = z.get("mics_shard_size", -1) or -1
    hpz = _integer(hpz, source, "zero_hpz_partition_size")
    mics = _integer(mics, source, "mics_shard_size")
    changes: dict[str, Any] = {}
    if mics > 0:
        if stage != 3:
            raise ConfigError(
                f"mics_shard_size needs stage 3, found stage {stage}", source=source, key="stage"
            )
        changes.update(params=mics, grads=mics, optim=mics)
    if hpz > 1:
        if stage != 3:
            raise ConfigError(
                f"zero_hpz_partition_size needs stage 3, found stage {stage}", source=source, key="stage"
            )
        changes.update(secondary=hpz, secondary_dtype="bf16")
    for k in ("zero_quantized_weights", "zero_quantized_gradients"):
        if k in z and not isinstance(z[k], bool):
            raise ConfigError(f"expected true or false, found {short(z[k])}", source=source, key=k)
    if z.get("zero_quantized_weights"):
        changes["quantize_weights"] = True
    if z.get("zero_quantized_gradients"):
        changes["quantize_grads"] = True
    if changes:
        name = (
            "zeropp"
            if hpz > 1 and changes.get("quantize_weights") and changes.get("quantize_grads")
            else None
        )
        plan = replace(plan, name=name or f"deepspeed-stage{stage}", **changes)
    return plan


def _scalar(text: str, source: str) -> Any:
    """One ``key=value`` value read as a YAML scalar (``4`` -> 4, ``true`` -> True), else the text."""
    if not text.strip():
        raise ConfigError("a KEY= with no value; give a value after '='", source=source)
    try:
        return load_yaml_text(text, source)
    except ConfigError:
        return text


def parse_plan_flags(text: str, source: str = "--plan") -> dict[str, Any]:
    """``"zerotopo,sync=host"`` or ``"params=package,grads=node,optim=world,secondary=node/int8"``: an
    optional preset first, then ``key=value`` pairs (values read as YAML scalars; ``secondary`` may carry
    its dtype after a slash)."""
    out: dict[str, Any] = {}
    for i, item in enumerate(p.strip() for p in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            if i or "preset" in out:
                raise ConfigError(f"expected KEY=VALUE after the preset, found {short(item)}", source=source)
            out["preset"] = item
            continue
        key, value = (x.strip() for x in item.split("=", 1))
        key = key.replace("-", "_")
        if key in out:
            raise ConfigError(f"key {short(key)} given twice in {short(text)}", source=source)
        if key == "secondary" and "/" in value:
            degree, dtype = value.split("/", 1)
            out["secondary"] = {"degree": _scalar(degree, source), "dtype": dtype}
        else:
            out[key] = _scalar(value, source)
    return out


def load_plan(spec: str | Mapping[str, Any] | Plan, source: str = "plan") -> Plan:
    """A plan from a preset name, a YAML file path, a mapping, inline flags (see
    :func:`parse_plan_flags`), or a plan."""
    if isinstance(spec, Plan):
        return spec
    if isinstance(spec, str) and "=" in spec:
        return plan_from_mapping(parse_plan_flags(spec, source), source=source)
    if isinstance(spec, Mapping):
        if "zero_optimization" in spec:
            return plan_from_deepspeed(spec["zero_optimization"], source=f"{source}: zero_optimization")
        return plan_from_mapping(spec, source=source)
    if isinstance(spec, str) and (spec.endswith((".yaml", ".yml", ".json")) or Path(spec).is_file()):
        raw = load_yaml_file(
            spec,
            what="plan file",
            hint=f"give a preset ({', '.join(PRESETS)}) or a plan YAML file (docs/plans.md)",
        )
        if isinstance(raw, Mapping) and "plan" in raw and len(raw) == 1:
            raw = raw["plan"]
        return load_plan(raw, source=spec) if not isinstance(raw, str) else get_preset(raw, spec)
    if isinstance(spec, str):
        return get_preset(spec)
    raise ConfigError(
        f"a plan must be a preset name, a file or a mapping, found {short(spec)} ({type(spec).__name__})",
        source=source,
    )


def enumerate_plans(
    topology: Topology,
    *,
    quantized: bool = True,
    secondary: bool = True,
    degree_filter: Callable[[int], bool] | None = None,
    keep: Callable[[int, int, int, int | None], bool] | None = None,
) -> list[Plan]:
    """Every valid Lins-style plan for ``topology``: nested degree triples, optional secondary
    partitions (bf16 or int8, any divisor of the world), with and without
    quantized collectives. Names are their labels. ``degree_filter`` keeps only the degrees it accepts
    and ``keep`` only the ``(params, grads, optim, secondary)`` it accepts (the planner's search space),
    before any plan is built."""
    world = topology.world_size
    divs = [x for x in divisors(world) if degree_filter is None or degree_filter(x)]
    plans: list[Plan] = []
    for p in divs:
        for g in (x for x in divs if x % p == 0):
            for o in (x for x in divs if x % g == 0):
                sec_opts: list[tuple[int | None, str]] = [(None, "bf16")]
                if secondary:
                    # A bf16 secondary of the primary's own degree would duplicate the primary.
                    sec_opts += [
                        (s, dt) for s in divs for dt in SECONDARY_DTYPES if not (s == p and dt == "bf16")
                    ]
                q_opts = [(False, False)]
                if quantized:
                    q_opts += [(qw, qg) for qw, qg in itertools.product((False, True), repeat=2) if qw or qg]
                if keep is not None:
                    sec_opts = [(s, dt) for s, dt in sec_opts if keep(p, g, o, s)]
                for (s, dt), (qw, qg) in itertools.product(sec_opts, q_opts):
                    if qw and p == 1 and s is None:
                        continue  # nothing to gather: int8 weights would change nothing
                    if qg and g == 1:
                        continue
                    name = _label(p, s, dt, g, o, qw, qg)
                    plans.append(Plan(name, p, g, o, s, dt, quantize_weights=qw, quantize_grads=qg))
    return plans
