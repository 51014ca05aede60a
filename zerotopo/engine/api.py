"""``parallelize``: wrap a plain PyTorch model for a plan, and a DeepSpeed-style facade on top.

::

    model, optimizer = parallelize(module, mesh=mesh, lr=3e-4, weight_decay=0.1)
    for x, y in micro_batches:                      # M micro-batches
        loss = loss_fn(model(x), y) / M
        model.scale_loss(loss).backward()           # identity unless fp16 loss scaling
    stats = optimizer.step()                        # {"grad_norm", "skipped", "loss_scale"}
    optimizer.zero_grad()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zerotopo.comm import collectives as C
from zerotopo.comm.mesh import Mesh
from zerotopo.engine.optim import ShardedOptimizer, make_scaler, resolve_optimizer
from zerotopo.engine.runtime import Runtime
from zerotopo.engine.streams import Sanitizer, Streams, emulated_delay_s
from zerotopo.engine.units import (
    FlatUnit,
    assign_params,
    collect_units,
    default_no_decay,
    materialize_meta,
    memory_bytes,
    reset_by_modules,
    unit_borrows,
)
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout

_DTYPES = {torch.float32, torch.bfloat16, torch.float16}


class ShardedModule(nn.Module):
    """A model whose parameters are sharded by a plan; call it like the model it wraps."""

    def __init__(self, module: nn.Module, units: list[FlatUnit], runtime: Runtime, mesh: Mesh) -> None:
        super().__init__()
        self.module = module
        self._units = units
        self._runtime = runtime
        self.mesh = mesh
        self.scaler: Any = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._runtime.begin_forward()
        out = self.module(*args, **kwargs)
        return self._runtime.end_forward(out)

    @property
    def units(self) -> list[FlatUnit]:
        return self._units

    def close(self) -> None:
        """Remove the engine's hooks and stop its copy engine (the model is unusable afterwards)."""
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
        return loss * self.scaler.scale if self.scaler is not None else loss

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds per model state: ``params``, ``secondary``, ``grads``, ``optim``."""
        secondary = sum(u.secondary_bytes() for u in self._units)
        return memory_bytes(self._units, secondary, self._optimizer.bytes_per_element)

    def unit_numels(self) -> list[int]:
        """Unpadded element counts of the units in forward order (the cost model's input)."""
        order = self._runtime.order or [u.index for u in self._units]
        return [self._units[i].numel for i in order]

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full fp32 master parameters by name (collective: all-gathers over the optimizer group)."""
        opt: ShardedOptimizer = self._optimizer
        d = self.mesh.degrees
        group = self.mesh.group("optim")
        order = [layout.optim_chunk(i, d) for i in range(d.optim)]
        out: dict[str, torch.Tensor] = {}
        for i, u in enumerate(self._units):
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
        opt: ShardedOptimizer = self._optimizer
        for i, u in enumerate(self._units):
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
        self._runtime.invalidate_secondaries()


def parallelize(
    module: nn.Module,
    *,
    mesh: Mesh,
    units: list[tuple[str, nn.Module]] | None = None,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype | None = None,
    init: Callable[[nn.Module], None] | None = None,
    lr: float = 1e-3,
    betas: tuple[float, float] | None = None,
    eps: float | None = None,
    weight_decay: float = 0.0,
    optimizer: str = "AdamW",
    optimizer_params: dict[str, Any] | None = None,
    no_decay: Callable[[str, torch.Tensor], bool] = default_no_decay,
    max_grad_norm: float | None = None,
    loss_scale: str | float | None = "dynamic",
    loss_scale_options: dict[str, Any] | None = None,
    ledger: Any = None,
    sanitize: bool = False,
    copy_delay_ms: float | None = None,
    unordered_secondary: bool = False,
) -> tuple[ShardedModule, ShardedOptimizer]:
    """Shard ``module`` by ``mesh.plan`` and return ``(model, optimizer)``.

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

    Optimizer: ``optimizer`` names torch's class (AdamW, Adam = AdamW as in NeoX, SGD, Adagrad, Adadelta,
    RMSprop, Adamax, NAdam, RAdam; see :mod:`zerotopo.config.optimizers`), ``optimizer_params`` its
    hyperparameters other than ``lr`` and ``weight_decay`` (``momentum``, ``nesterov``, ``alpha``, ...);
    ``betas`` and ``eps`` (default ``(0.9, 0.95)`` and ``1e-8`` for the types that take them) may be
    given here too. A type or hyperparameter the table does not know is a :class:`ZerotopoError`.

    Gradients: ``mesh.plan.grad_dtype`` ``"param"`` keeps the per-micro-batch reduction and the gradient
    shard in ``param_dtype``; ``"fp32"`` or unset keeps the shard in fp32 and reduces in ``reduce_dtype``
    (default fp32). ``loss_scale_options``: :class:`LossScaler` keywords
    for dynamic fp16 scaling (``init_scale``, ``growth_interval``, ``hysteresis``, ``min_scale``).
    ``copy_delay_ms`` delays the CPU emulated copy engine (on a device: a spin kernel before each copy)
    (default ``$ZEROTOPO_EMULATED_COPY_DELAY_MS`` or 0). ``sanitize`` checks the ordering rules on every
    collective that reads a buffer another stream wrote. ``unordered_secondary`` is a test and
    benchmark hook that reproduces the stock hpZ race (papers/000): the backward all-gather does not
    wait for the secondary partition's copy. No plan or CLI option selects it.
    """
    grad_dtype, reduce_dtype = resolve_grad_dtypes(mesh.plan.grad_dtype, param_dtype, reduce_dtype)
    resolve_optimizer(optimizer, optimizer_params, betas=betas, eps=eps)  # refused before any unit is built
    _check_wrappable(module, param_dtype, reduce_dtype)
    _move_buffers(module, mesh.device)
    init_fn = init or getattr(module, "init_unit", None) or reset_by_modules
    flat_units = _build_units(
        module, mesh, units, init_fn, param_dtype=param_dtype, grad_dtype=grad_dtype, no_decay=no_decay
    )
    streams = Streams(mesh.device, copy_delay_s=emulated_delay_s(copy_delay_ms))
    runtime = Runtime(
        flat_units, mesh, reduce_dtype=reduce_dtype, ledger=ledger, streams=streams,
        sanitizer=Sanitizer(sanitize), unordered_secondary=unordered_secondary,
    )  # fmt: skip
    scaler = make_scaler(loss_scale, param_dtype, **(loss_scale_options or {}))
    sharded_optimizer = ShardedOptimizer(
        flat_units, mesh, runtime, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
        max_grad_norm=max_grad_norm, scaler=scaler, ledger=ledger, optimizer=optimizer,
        hyperparameters=optimizer_params,
    )  # fmt: skip
    model = ShardedModule(module, flat_units, runtime, mesh)
    model.scaler = scaler
    model._optimizer = sharded_optimizer  # full_state_dict reads the fp32 master shards
    module._zerotopo_wrapped = True
    if dist.is_initialized():
        dist.barrier()
    return model, sharded_optimizer


def _check_wrappable(module: nn.Module, param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
    """Refuse dtypes the engine does not run and a module wrapped before."""
    if param_dtype not in _DTYPES or reduce_dtype not in _DTYPES:
        raise ZerotopoError(
            f"param_dtype and reduce_dtype must be torch.float32, bfloat16 or float16, got {param_dtype} "
            f"and {reduce_dtype}"
        )
    if isinstance(module, ShardedModule) or getattr(module, "_zerotopo_wrapped", False):
        raise ZerotopoError("this module was already parallelized; wrap the original model once")


def _build_units(
    module: nn.Module,
    mesh: Mesh,
    units: list[tuple[str, nn.Module]] | None,
    init_fn: Callable[[nn.Module], None],
    *,
    param_dtype: torch.dtype,
    grad_dtype: torch.dtype,
    no_decay: Callable[[str, torch.Tensor], bool],
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
            param_dtype=param_dtype, device=mesh.device, no_decay=no_decay, grad_dtype=grad_dtype,
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


class Engine:
    """A DeepSpeed-style facade: ``engine(x)``, ``engine.backward(loss)``, ``engine.step()``.

    ``step()`` applies the optimizer every ``accumulation_steps`` calls (one per micro-batch), as
    DeepSpeed's engine does; ``backward`` divides the loss by ``accumulation_steps`` and applies the
    loss scale.
    """

    def __init__(
        self, model: ShardedModule, optimizer: ShardedOptimizer, *, accumulation_steps: int = 1
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.micro_steps = 0
        self.last_stats: dict[str, Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self.model.set_is_last_backward((self.micro_steps + 1) % self.accumulation_steps == 0)
        self.model.scale_loss(loss / self.accumulation_steps).backward()

    def step(self) -> dict[str, Any] | None:
        self.micro_steps += 1
        if self.micro_steps % self.accumulation_steps:
            return None
        self.last_stats = self.optimizer.step()
        self.optimizer.zero_grad()
        return self.last_stats
