"""The rows of ``zerotopo bench compare``: one sharded model and optimizer step per framework.

Every row starts from the same weights (:func:`build_model`, seeded) and the same AdamW settings, runs
in the same precision (``dtype``: each framework's bf16 mode, or fp32; :mod:`zerotopo_lab.bench.precision`),
and runs one optimizer step over ``M`` micro-batches with the loss divided by ``M``:

- ``zerotopo`` rows: :func:`zerotopo.engine.parallelize` under a plan (a preset or the planner's pick).
- ``deepspeed-zero3`` / ``deepspeed-hpz``: ``deepspeed.initialize`` with ZeRO stage 3, every parameter
  sharded and re-gathered for the backward (``stage3_param_persistence_threshold: 0``,
  ``stage3_max_reuse_distance: 0``, as zerotopo's zero3), and for hpZ a secondary partition over a node
  (``zero_hpz_partition_size``). DeepSpeed's quantized collectives (qwZ, qgZ) need its CUDA kernels, so
  on CPU its hpZ row runs the secondary partition alone.
- ``fsdp2-hsdp``: ``torch.distributed.fsdp.fully_shard`` per layer and on the root over a 2-D
  DeviceMesh (replicate across nodes x shard inside a node); gradients are reduce-scattered inside the
  node every micro-batch and all-reduced across nodes on the last one (``set_requires_all_reduce``).
- ``fsdp2-hpz``: ``fully_shard`` over the whole job with ``reshard_after_forward=<node size>``: after
  the forward each weight stays gathered over a node, so the backward gathers only inside the node.
- ``no-comm``: each rank steps its own replica without any communication, the compute floor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from zerotopo.models.config import NeoXConfig
from zerotopo_lab.bench import FLOOR_ROW
from zerotopo_lab.bench.precision import torch_dtype

BETAS = (0.9, 0.95)
EPS = 1e-8


@dataclass
class Row:
    """A built row: ``step(batches)`` runs one optimizer step and returns the mean micro-batch loss."""

    step: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], float]
    close: Callable[[], None] = field(default=lambda: None)
    info: dict[str, Any] = field(default_factory=dict)
    settle: Callable[[], None] | None = None
    """Land every collective a step left in flight (the engine's lazy parameter gathers), so the links'
    counters hold all of the steps run so far; None: a step leaves none."""


Hook = Callable[[torch.nn.Module], Any]
"""Called on each row's model once built, before any framework wraps it (the device clock's unit
waits, :func:`zerotopo_lab.bench.devicewait.install_units`)."""


def build_model(cfg: NeoXConfig, seed: int = 0, hook: Hook | None = None) -> torch.nn.Module:
    """The benchmark's GPT-NeoX with the same weights on every rank and for every row; ``hook`` is
    called on it."""
    from zerotopo.models.neox import GPTNeoX

    torch.manual_seed(seed)
    model = GPTNeoX(cfg)
    if hook is not None:
        hook(model)
    return model


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def zerotopo_row(
    cfg: NeoXConfig, topo: Any, plan: Any, rank: int, lr: float, dtype: str = "fp32", hook: Hook | None = None
) -> Row:
    """The engine under ``plan``; ``bf16``: weights gathered and gradients reduced in bf16 (fp32 shard)."""
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, parallelize

    mesh = build_mesh(topo, plan, topo_index=rank)
    wire = torch_dtype(dtype)
    model = parallelize(build_model(cfg, hook=hook), mesh=mesh, mp_policy=MixedPrecision(wire, wire))
    opt = ShardedOptimizer(model, lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0)

    def step(batches):
        m = len(batches)
        total = 0.0
        for k, (x, y) in enumerate(batches):
            loss = _loss(model(x), y)
            model.set_is_last_backward(k == m - 1)
            (loss / m).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        return total / m

    def settle() -> None:
        for u in model.units:
            u.settle_params()

    return Row(step, model.close, {"degrees": plan.label(topo)}, settle)


def deepspeed_row(
    cfg: NeoXConfig,
    topo: Any,
    hpz: bool,
    micro_batch: int,
    micro_batches: int,
    lr: float,
    buckets: dict[str, int] | None = None,
    dtype: str = "fp32",
    hook: Hook | None = None,
) -> Row:
    """DeepSpeed ZeRO-3 (``hpz``: with a per-node secondary partition); ``buckets``: prefetch, reduce and
    persistence sizes in elements (:func:`zerotopo_lab.bench.regime.deepspeed_buckets`), else persistence
    0 and DeepSpeed's default buckets; ``bf16``: DeepSpeed's bf16 mode (bf16 weights and gathers,
    gradients reduced in bf16, fp32 master weights)."""
    import deepspeed

    zero: dict[str, Any] = {
        "stage": 3,
        # DeepSpeed keeps parameters under 1e5 elements whole on every rank and keeps gathered
        # parameters that are reused soon by default; 0 for both is the ZeRO-3 schedule zerotopo's zero3
        # runs (gather in the forward, again in the backward).
        "stage3_param_persistence_threshold": 0,
        "stage3_max_reuse_distance": 0,
        # on (DeepSpeed's default), DeepSpeed replaces torch.nn.functional.linear for the rest of the
        # process, so the rows after this one would run its autograd function too, and that function's
        # backward multiplies outside zerotopo_lab.bench.precision's fp32 arithmetic (bf16 products run ~40x
        # slower on a CPU): off, DeepSpeed runs torch's linear as every other row does
        "memory_efficient_linear": False,
    }
    if buckets is not None:
        zero["stage3_param_persistence_threshold"] = buckets["persistence"]
        zero["stage3_prefetch_bucket_size"] = buckets["prefetch"]
        zero["reduce_bucket_size"] = buckets["reduce"]
    if hpz:
        zero["zero_hpz_partition_size"] = topo.devices_per_node
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": micro_batches,
        "train_batch_size": micro_batch * micro_batches * topo.world_size,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    model = build_model(cfg, hook=hook)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=config, dist_init_required=False)

    def step(batches):
        total = 0.0
        for x, y in batches:
            loss = _loss(engine(x), y)
            engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps
            engine.step()  # applies the optimizer on the last micro-batch
            total += loss.item()
        return total / len(batches)

    def close():
        destroy = getattr(engine, "destroy", None)
        if destroy is not None:
            destroy()

    degrees = f"p=W s={topo.devices_per_node} g=W o=W" if hpz else "p=W g=W o=W"
    return Row(step, close, {"degrees": degrees})


def fsdp2_mesh(topo: Any, hpz: bool) -> Any:
    """The DeviceMesh an FSDP2 row shards over: the whole job (hpZ-like), or nodes x node (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    if hpz:
        return init_device_mesh("cpu", (topo.world_size,), mesh_dim_names=("shard",))
    return init_device_mesh("cpu", (topo.nodes, topo.devices_per_node), mesh_dim_names=("replicate", "shard"))


def fsdp2_row(
    cfg: NeoXConfig, topo: Any, hpz: bool, lr: float, dtype: str = "fp32", hook: Hook | None = None
) -> Row:
    """FSDP2 (HSDP or hpZ-like resharding); ``bf16``: its mixed-precision policy gathers and reduces in
    bf16 (fp32 sharded parameters)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    node = topo.devices_per_node
    model = build_model(cfg, hook=hook)
    mesh = fsdp2_mesh(topo, hpz)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if hpz:
        kwargs["reshard_after_forward"] = node
    if dtype != "fp32":
        wire = torch_dtype(dtype)
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=wire, reduce_dtype=wire)
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0)

    def step(batches):
        m = len(batches)
        total = 0.0
        for i, (x, y) in enumerate(batches):
            if not hpz and topo.nodes > 1:
                # HSDP: reduce-scatter inside the node every micro-batch, all-reduce across nodes once
                model.set_requires_all_reduce(i == m - 1)
            loss = _loss(model(x), y)
            (loss / m).backward()
            total += loss.item()
        optim.step()
        optim.zero_grad()
        return total / m

    degrees = f"p=W secondary={node} (reshard_after_forward)" if hpz else f"p={node} g={node} o={node}"
    return Row(step, info={"degrees": degrees})


def prepare_row(name: str) -> None:
    """Import what the row needs before its memory is measured (a library is not the row's memory);
    raises ImportError on every rank alike when it is missing."""
    if name.startswith("deepspeed-"):
        try:
            import deepspeed
        except ImportError as exc:
            raise ImportError(f"{exc}; install the benchmark extra: pip install 'zerotopo[bench]'") from exc
        deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    elif name.startswith("fsdp2-"):
        import torch.distributed.fsdp  # noqa: F401


def warm_up(cfg: NeoXConfig) -> None:
    """One forward, backward and AdamW step of the model on this rank alone, so one-time start-up
    allocations (autograd's threads, kernel workspaces) land before the first row is measured."""
    model = build_model(cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=0.0)
    x = torch.zeros(1, 8, dtype=torch.long)
    _loss(model(x), x).backward()
    optim.step()


def floor_row(cfg: NeoXConfig, lr: float, dtype: str = "fp32", hook: Hook | None = None) -> Row:
    """Each rank its own replica, no communication; ``bf16``: a bf16 working copy computes, its
    gradients step fp32 master weights, which are copied back (what a sharded row does, unsharded)."""
    master = build_model(cfg)
    optim = torch.optim.AdamW(master.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0)
    model = master if dtype == "fp32" else copy.deepcopy(master).to(torch_dtype(dtype))
    if hook is not None:  # the model that computes waits (the fp32 master, or its bf16 copy)
        hook(model)
    pairs = list(zip(master.parameters(), model.parameters()))

    def step(batches):
        total = 0.0
        for x, y in batches:
            loss = _loss(model(x), y)
            (loss / len(batches)).backward()
            total += loss.item()
        if model is not master:
            for p, w in pairs:
                p.grad = w.grad.float()
                w.grad = None
        optim.step()
        optim.zero_grad()
        if model is not master:
            with torch.no_grad():
                for p, w in pairs:
                    w.copy_(p)
        return total / len(batches)

    return Row(step, info={"degrees": "replica per rank, no sync"})


def build_row(
    name: str, plan: Any, cfg: NeoXConfig, topo: Any, rank: int, opts: Any, hook: Hook | None = None
) -> Row:
    """The row called ``name`` (``plan``: the zerotopo plan of a zerotopo row, else None); ``hook``: see
    :data:`Hook`."""
    dt = opts.dtype
    if name == FLOOR_ROW:
        return floor_row(cfg, opts.lr, dt, hook)
    if plan is not None:
        return zerotopo_row(cfg, topo, plan, rank, opts.lr, dt, hook)
    if name in ("deepspeed-zero3", "deepspeed-hpz"):
        hpz = name == "deepspeed-hpz"
        return deepspeed_row(
            cfg, topo, hpz, opts.batch, opts.micro_batches, opts.lr, opts.deepspeed_buckets, dt, hook
        )
    if name in ("fsdp2-hsdp", "fsdp2-hpz"):
        return fsdp2_row(cfg, topo, name == "fsdp2-hpz", opts.lr, dt, hook)
    raise ValueError(f"unknown benchmark row {name!r}")
