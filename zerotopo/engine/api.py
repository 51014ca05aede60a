"""``parallelize``: shard a plain PyTorch model in place for a plan, as FSDP2's ``fully_shard`` does.

::

    model = parallelize(module, mesh=mesh, mp_policy=MixedPrecision(param_dtype=torch.bfloat16))
    optimizer = ShardedOptimizer(model, torch.optim.AdamW, lr=3e-4, weight_decay=0.1, max_grad_norm=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 100))
    for x, y in micro_batches:                      # M micro-batches
        loss = loss_fn(model(x), y) / M
        model.scale_loss(loss).backward()           # identity unless fp16 loss scaling
    stats = optimizer.step()                        # {"grad_norm", "skipped", "loss_scale"}
    scheduler.step()
    optimizer.zero_grad()

Instrumentation and test hooks (a communication ledger, the ordering sanitizer, the emulated copy
delay, the unordered hpZ hook) are not part of this signature: :mod:`zerotopo.engine.debug` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from zerotopo.comm import collectives as C
from zerotopo.comm.mesh import Mesh
from zerotopo.engine.runtime import Runtime
from zerotopo.engine.streams import Sanitizer, Streams, emulated_delay_s
from zerotopo.engine.units import (
    FlatUnit,
    assign_params,
    collect_units,
    materialize_meta,
    memory_bytes,
    reset_by_modules,
    unit_borrows,
)
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout

if TYPE_CHECKING:
    from zerotopo.engine.debug import DebugOptions
    from zerotopo.engine.optim import ShardedOptimizer

_DTYPES = {torch.float32, torch.bfloat16, torch.float16}


@dataclass(frozen=True)
class MixedPrecision:
    """The dtypes the engine computes and communicates in (FSDP2's ``MixedPrecisionPolicy``).

    ``param_dtype``: the gathered weights the forward and backward use (the master weights stay
    fp32). ``reduce_dtype``: the gradient reduce-scatter's dtype (default fp32; a plan with
    ``grad_dtype: param`` reduces in ``param_dtype`` and refuses another)."""

    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype | None = None


@dataclass
class _ShardState:
    """What :func:`parallelize` attaches to the module: its units, runtime and mesh, and the sharded
    optimizer (with its loss scaler) once one is built over it."""

    units: list[FlatUnit]
    runtime: Runtime
    mesh: Mesh
    param_dtype: torch.dtype
    optimizer: Any = None
    scaler: Any = None
    handles: tuple[Any, ...] = ()


class ShardedModule:
    """The methods a parallelized module gains: :func:`parallelize` changes the module's class to a
    subclass of both this class and its own (as FSDP2's ``FSDPModule``), so the module is called as
    before and ``isinstance(model, ShardedModule)`` tells that it is sharded."""

    _zerotopo: _ShardState

    @property
    def units(self) -> list[FlatUnit]:
        """The flat units in unit order."""
        return self._zerotopo.units

    @property
    def mesh(self) -> Mesh:
        return self._zerotopo.mesh

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the gathered weights (the mixed-precision policy's ``param_dtype``)."""
        return self._zerotopo.param_dtype

    @property
    def scaler(self) -> Any:
        """The fp16 loss scaler of the optimizer built over this model (None without loss scaling)."""
        return self._zerotopo.scaler

    @property
    def _runtime(self) -> Runtime:
        return self._zerotopo.runtime

    @property
    def _optimizer(self) -> ShardedOptimizer:
        opt = self._zerotopo.optimizer
        if opt is None:
            raise ZerotopoError(
                "the fp32 master weights live in the sharded optimizer: build ShardedOptimizer(model, ...) first"
            )
        return opt

    def close(self) -> None:
        """Remove the engine's hooks and stop its copy engine (the model is unusable afterwards)."""
        for h in self._zerotopo.handles:
            h.remove()
        self._runtime.remove()
        self._runtime.streams.close()

    def set_is_last_backward(self, last: bool = True) -> None:
        """Mark the next backward as the last before ``optimizer.step()`` (the last micro-batch): each
        unit's cross-replica gradient reduction then starts as soon as its gradient shard is final and
        runs beside the rest of the backward (see [Note: last backward] in ``runtime.py``). Results are
        bit-identical either way; without the mark the step runs the reductions itself. A further
        backward before ``optimizer.step()`` is refused (its gradients would miss the reduction)."""
        self._runtime.last_backward = bool(last)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the fp16 loss scale (unchanged without loss scaling)."""
        scaler = self.scaler
        return loss * scaler.scale if scaler is not None else loss

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds per model state: ``params``, ``secondary``, ``grads``, ``optim``."""
        secondary = sum(u.secondary_bytes() for u in self.units)
        out = memory_bytes(self.units, secondary, self._optimizer.bytes_per_element)
        out["optim"] += self._optimizer.owned_bytes  # Muon: the matrices this rank owns
        return out

    def unit_numels(self) -> list[int]:
        """Unpadded element counts of the units in forward order (the cost model's input)."""
        order = self._runtime.order or [u.index for u in self.units]
        return [self.units[i].numel for i in order]

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full fp32 master parameters by name (collective: all-gathers over the optimizer group)."""
        opt = self._optimizer
        d = self.mesh.degrees
        group = self.mesh.group("optim")
        order = [layout.optim_chunk(i, d) for i in range(d.optim)]
        out: dict[str, torch.Tensor] = {}
        for i, u in enumerate(self.units):
            chunk = opt.master[i]
            n = chunk.numel()
            full = torch.empty(u.padded, dtype=torch.float32, device=u.device)
            if d.optim > 1:
                gathered = torch.empty_like(full)
                C.all_gather(gathered, chunk, group, tag=f"state_dict {u.name}")
                for pos, c in enumerate(order):
                    full[c * n : (c + 1) * n] = gathered[pos * n : (pos + 1) * n]
            else:
                full.copy_(chunk)
            for s in u.slots:
                out[s.name] = full[s.offset : s.offset + s.numel].view(s.shape).clone().cpu()
        return out

    @torch.no_grad()
    def load_full_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load full parameters (every rank passes the same dict): master, shards and secondaries."""
        opt = self._optimizer
        for i, u in enumerate(self.units):
            flat = torch.zeros(u.padded, dtype=torch.float32, device=u.device)
            for s in u.slots:
                if s.name not in sd:
                    raise ZerotopoError(f"state dict has no parameter {s.name!r} (it has {len(sd)} entries)")
                t = sd[s.name]
                if tuple(t.shape) != tuple(s.shape):
                    raise ZerotopoError(
                        f"parameter {s.name!r}: state dict shape {tuple(t.shape)}, model {tuple(s.shape)}"
                    )
                flat[s.offset : s.offset + s.numel] = t.reshape(-1).to(flat)
            opt.master[i].copy_(flat[u.o_range[0] : u.o_range[1]])
            lo, hi = u.p_range
            u.settle_params()  # an update in flight must not land over the loaded weights
            u.param_shard.copy_(flat[lo:hi])
        opt.shards_written()  # Muon: the owners take the loaded matrices
        self._runtime.invalidate_secondaries()


def parallelize(
    module: nn.Module,
    *,
    mesh: Mesh,
    mp_policy: MixedPrecision = MixedPrecision(),
    units: list[tuple[str, nn.Module]] | None = None,
    init: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Shard ``module`` in place by ``mesh.plan`` and return it (now also a :class:`ShardedModule`).

    Build the optimizer over it separately: :class:`~zerotopo.engine.optim.ShardedOptimizer` takes
    torch's optimizer class and its arguments, and is a ``torch.optim.Optimizer``.

    ``units``: ``(name, module)`` pairs; by default each child of every ``nn.ModuleList`` and every other
    top-level child with parameters, plus a root unit for parameters owned by none of them. A parameter
    two units use (tied embeddings) belongs to the first and is gathered with the second (see [Note: tied
    parameters] in ``units.py``); a unit with no parameters of its own besides such a one is refused.

    [Note: shard-only start-up] ``module`` may be built on the meta device (``with torch.device("meta"):``).
    Its units are then materialized one at a time, in unit order: the unit's padded fp32 buffer is
    allocated on the CPU, ``init(unit_module)`` fills it in place (default: the model's own
    ``init_unit(module)`` method, else ``reset_parameters()`` of every submodule), this rank keeps its
    parameter, master and optimizer slices on ``mesh.device``, and the full buffer is dropped before the
    next unit (with ``params == 1`` the full buffer is the rank's own shard and stays). No rank holds more
    than one full unit at a time. ``init`` draws from the CPU's default generator in unit order, so a
    model whose eager construction draws in the same order (as :class:`~zerotopo.models.neox.GPTNeoX`
    and stock torch layers do) gets exactly the values an eager build after the same ``torch.manual_seed``
    gets. An already materialized model is flattened unit by unit the same way (every rank must pass the
    same values).

    Gradients: ``mesh.plan.grad_dtype`` ``"param"`` keeps the per-micro-batch reduction and the gradient
    shard in ``mp_policy.param_dtype``; ``"fp32"`` or unset keeps the shard in fp32 and reduces in
    ``mp_policy.reduce_dtype`` (default fp32).
    """
    return shard_module(module, mesh=mesh, mp_policy=mp_policy, units=units, init=init, debug=None)


def shard_module(
    module: nn.Module,
    *,
    mesh: Mesh,
    mp_policy: MixedPrecision,
    units: list[tuple[str, nn.Module]] | None,
    init: Callable[[nn.Module], None] | None,
    debug: DebugOptions | None,
) -> nn.Module:
    """:func:`parallelize` with the debug options of :mod:`zerotopo.engine.debug` (None: none)."""
    from zerotopo.engine.debug import DebugOptions

    debug = debug or DebugOptions()
    param_dtype = mp_policy.param_dtype
    grad_dtype, reduce_dtype = resolve_grad_dtypes(mesh.plan.grad_dtype, param_dtype, mp_policy.reduce_dtype)
    _check_wrappable(module, param_dtype, reduce_dtype)
    _move_buffers(module, mesh.device)
    init_fn = init or getattr(module, "init_unit", None) or reset_by_modules
    flat_units = _build_units(module, mesh, units, init_fn, param_dtype=param_dtype, grad_dtype=grad_dtype)
    streams = Streams(mesh.device, copy_delay_s=emulated_delay_s(debug.copy_delay_ms))
    runtime = Runtime(
        flat_units, mesh, reduce_dtype=reduce_dtype, ledger=debug.ledger, streams=streams,
        sanitizer=Sanitizer(debug.sanitize), unordered_secondary=debug.unordered_secondary,
    )  # fmt: skip
    # The runtime's unit hooks are registered first; the model's pre-hook runs before them, its post-hook
    # after them.
    handles = (
        module.register_forward_pre_hook(lambda m, a: runtime.begin_forward(), prepend=True),
        module.register_forward_hook(lambda m, a, out: runtime.end_forward(out)),
    )
    state = _ShardState(flat_units, runtime, mesh, param_dtype, handles=handles)
    cls = module.__class__
    module.__class__ = type(f"Sharded{cls.__name__}", (ShardedModule, cls), {"__module__": cls.__module__})
    module._zerotopo = state
    if dist.is_initialized():
        dist.barrier()
    return module


def _check_wrappable(module: nn.Module, param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
    """Refuse dtypes the engine does not run and a module wrapped before."""
    if param_dtype not in _DTYPES or reduce_dtype not in _DTYPES:
        raise ZerotopoError(
            f"param_dtype and reduce_dtype must be torch.float32, bfloat16 or float16, got {param_dtype} "
            f"and {reduce_dtype}"
        )
    if isinstance(module, ShardedModule) or "_zerotopo" in vars(module):
        raise ZerotopoError("this module was already parallelized; wrap the original model once")
    taken = [
        n
        for n in vars(ShardedModule)
        if not n.startswith("__")
        and (
            hasattr(type(module), n)
            or any(n in d for d in (vars(module), module._modules, module._parameters))
        )
    ]
    if taken:
        raise ZerotopoError(
            f"{type(module).__name__} defines {', '.join(taken)}, which the sharded module's methods use; "
            f"rename them in the model (or wrap it in a container module) before parallelize"
        )


def _build_units(
    module: nn.Module,
    mesh: Mesh,
    units: list[tuple[str, nn.Module]] | None,
    init_fn: Callable[[nn.Module], None],
    *,
    param_dtype: torch.dtype,
    grad_dtype: torch.dtype,
) -> list[FlatUnit]:
    """The model's units, flattened (and materialized from the meta device) one at a time, in unit
    order: a sharded unit's full buffer is dropped before the next one is built (see the note)."""
    pairs, stray = assign_params(module, collect_units(module, units))
    borrows = unit_borrows(pairs)
    pairs = [(n, m, p) for n, m, p in pairs if p]
    if stray:
        pairs.append(("<root>", None, stray))
    if not pairs:
        raise ZerotopoError("the model has no parameters to shard")
    flat_units = []
    for i, (name, mod, params) in enumerate(pairs):
        padded = layout.padded_numel(sum(p.numel() for _, p in params), mesh.degrees)
        flat32, params = materialize_meta(module, name, mod, params, padded, init_fn)
        u = FlatUnit(
            name, mod, params, index=i, degrees=mesh.degrees, topo_index=mesh.topo_index,
            param_dtype=param_dtype, device=mesh.device, grad_dtype=grad_dtype,
            flat32=flat32,
        )  # fmt: skip
        del flat32
        if u.sharded:
            u.free_full()
        flat_units.append(u)
    by_name = {u.name: u for u in flat_units}
    for u in flat_units:
        u.borrows = [by_name[n] for n in borrows.get(u.name, [])]
    return flat_units


def resolve_grad_dtypes(
    grad_dtype: str | None, param_dtype: torch.dtype, reduce_dtype: torch.dtype | None
) -> tuple[torch.dtype, torch.dtype]:
    """(gradient shard dtype, reduce-scatter dtype) for a plan's ``grad_dtype``: ``"param"`` keeps both in
    the parameter dtype (DeepSpeed's default, ``grad_accum_dtype`` = the model dtype); ``"fp32"`` or
    ``None`` keeps an fp32 shard and reduces in ``reduce_dtype`` (fp32 when not given)."""
    if grad_dtype == "param":
        if reduce_dtype is not None and reduce_dtype != param_dtype:
            raise ZerotopoError(
                f"plan grad_dtype 'param' reduces gradients in the parameter dtype {param_dtype}, but "
                f"reduce_dtype={reduce_dtype} was passed; drop reduce_dtype or use grad_dtype: fp32"
            )
        return param_dtype, param_dtype
    return torch.float32, reduce_dtype or torch.float32


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    """Put the module's buffers on ``device`` (parameters are copied unit by unit by ``FlatUnit``)."""
    for m in module.modules():
        for name, b in m._buffers.items():
            if b is None:
                continue
            if b.is_meta:
                raise ZerotopoError(
                    f"buffer {name!r} of {type(m).__name__} is on the meta device; the engine materializes "
                    f"parameters only: build buffers on a real device or compute them in forward"
                )
            if b.device != device:
                m._buffers[name] = b.to(device)
