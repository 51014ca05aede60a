"""Sharded units: one flat buffer per module, and the shards of it each rank holds.

A unit (a transformer layer, the embedding, the head) is flattened into one buffer of
``layout.padded_numel(n, degrees)`` elements. Each rank holds, per unit (see ``zerotopo.placement.layout``):

- the primary parameter shard ``param_range`` in the parameter dtype;
- the secondary partition ``secondary_range`` of the full weight in its codec (bf16 or int8), when the
  plan has one (:meth:`FlatUnit.write_secondary`);
- an fp32 gradient shard ``grad_range`` that accumulates over micro-batches;
- the optimizer shard ``optim_range``: fp32 master weights and Adam's two moments (in :mod:`.optim`).

While a unit is unsharded its parameters are real ``nn.Parameter``s whose ``.data`` are views into the
full flat buffer. [Note: freeing full weights] Freeing resizes the buffer's storage to zero instead of
dropping the tensor (as FSDP does), so views saved by autograd stay valid and see the weights again once
the backward all-gather refills the same storage.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zerotopo.comm.collectives import Reduction
from zerotopo.comm.qcollectives import WireCodec
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout
from zerotopo.placement.plan import Degrees
from zerotopo.placement.schedule import UnitSteps


class UnitState(enum.Enum):
    """Where a unit's full weights are."""

    SHARDED = "sharded"  # only shards held; the full buffer has no storage
    GATHERING = "gathering"  # an all-gather into the full buffer was issued and not waited yet
    FULL = "full"  # the full buffer holds the weights (param views are valid)


@dataclass
class ParamSlot:
    """One parameter's place in its unit's flat buffer."""

    name: str
    param: nn.Parameter
    offset: int
    numel: int
    shape: torch.Size
    decay: bool

    @property
    def trainable(self) -> bool:
        return self.param.requires_grad


def default_no_decay(name: str, param: torch.Tensor) -> bool:
    """NeoX's rule: no weight decay for biases and norm weights (every parameter with ``ndim < 2``)."""
    return param.ndim < 2


@dataclass(frozen=True)
class UnitComm:
    """A unit's collectives (its entry of the step schedule) and the codecs and groups that run them,
    chosen once when the unit is built (:meth:`FlatUnit.bind`)."""

    steps: UnitSteps
    forward: WireCodec
    """The forward all-gather from the parameter shard (and the backward's when no secondary partition
    was written)."""
    backward: WireCodec
    """The backward all-gather from the parameter shard (plans without a secondary partition)."""
    reduce: WireCodec
    """The per-micro-batch gradient reduce-scatter."""
    reduce_hops: tuple[Any, Any]
    """The node's and the cross-node group of a two-hop reduction, else ``(None, None)``."""
    replica: tuple[Reduction, ...]
    """The cross-replica reduction of the gradient shard, link by link (the schedule's ``replica``)."""
    secondary: WireCodec | None
    """The secondary partition's codec (None: the plan has no secondary partition)."""


class FlatUnit:
    """The buffers of one unit on one rank, and its transitions between sharded and full."""

    def __init__(
        self,
        name: str,
        module: nn.Module,
        params: list[tuple[str, nn.Parameter]],
        *,
        index: int,
        degrees: Degrees,
        topo_index: int,
        param_dtype: torch.dtype,
        device: torch.device,
        no_decay: Any = default_no_decay,
        grad_dtype: torch.dtype = torch.float32,
        flat32: torch.Tensor | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.index = index
        self.degrees = degrees
        self.param_dtype = param_dtype
        self.device = device
        self.slots: list[ParamSlot] = []
        offset = 0
        for pname, p in params:
            self.slots.append(ParamSlot(pname, p, offset, p.numel(), p.shape, decay=not no_decay(pname, p)))
            offset += p.numel()
        self.numel = offset
        self.padded = layout.padded_numel(offset, degrees)
        t = topo_index
        self.p_range = layout.param_range(t, degrees, self.padded)
        self.g_range = layout.grad_range(t, degrees, self.padded)
        self.o_range = layout.optim_range(t, degrees, self.padded)
        self.s_range = (
            layout.secondary_range(t, degrees, self.padded) if degrees.secondary is not None else None
        )
        check_nesting(self)
        self.trainable_count = sum(1 for s in self.slots if s.trainable)

        # The full flat buffer: its storage is allocated while the unit is FULL and resized to 0 otherwise.
        # ``flat32`` (the unit's fp32 values, padded, on any device) is read once: this rank keeps its
        # slices; ``parallelize`` frees the full buffer of a sharded unit before it builds the next one.
        if flat32 is None:
            flat32 = flatten_params(self.slots, self.padded, device)
        elif flat32.numel() != self.padded or flat32.dtype != torch.float32:
            raise ZerotopoError(
                f"unit {name!r}: flat buffer has {flat32.numel()} {flat32.dtype} elements, need {self.padded} fp32"
            )
        # The fp32 master chunk comes from the module's own values, before any cast to param_dtype.
        self.initial_master = flat32[self.o_range[0] : self.o_range[1]].to(device, copy=True)
        # (no copy when flat32 already is fp32 on the device)
        self.full = flat32.to(device=device, dtype=param_dtype)
        self.sharded = degrees.params > 1
        if self.sharded:
            self.param_shard = self.full[self.p_range[0] : self.p_range[1]].clone()
        else:
            self.param_shard = self.full  # p == 1: the shard is the full buffer; it is never freed
        self.grad_dtype = grad_dtype
        self.grad_shard = torch.zeros(self.g_range[1] - self.g_range[0], dtype=grad_dtype, device=device)
        self.set_views()
        self.state = UnitState.FULL
        self.secondary: Any = None  # a streams.Ready holding the secondary partition, or None
        self.comm: UnitComm | None = None  # set by bind() when the engine is built
        self.gather: Any = None  # pending all-gather: (Pending, source) while GATHERING
        # Earlier units whose parameters this unit's module also uses (tied weights): gathered with it
        # (see [Note: tied parameters]); set by ``parallelize``.
        self.borrows: list[FlatUnit] = []
        # The post-step parameter all-gather still in flight (optim.py [Note: lazy parameter gather]):
        # a function of the stream that lands it in param_shard, or None.
        self.param_update: Any = None
        # The cross-replica reduction the last backward started (a streams.Ready whose tensor is the
        # reduced optimizer chunk), taken by the optimizer's step (runtime.py [Note: last backward]).
        self.replica_pending: Any = None
        # Per micro-batch bookkeeping (runtime.py).
        self.grads_ready = 0
        self.reduced = False
        self.backward_started = False

    def bind(self, comm: UnitComm) -> None:
        """Give the unit its collectives and codecs (once, when the engine is built)."""
        self.comm = comm

    # -- the secondary partition -----------------------------------------------------------------------
    def secondary_bytes(self) -> int:
        """Bytes of this rank's secondary partition in its codec (0 without one)."""
        if self.s_range is None or self.comm is None or self.comm.secondary is None:
            return 0
        c = self.comm.secondary
        return c.spec.payload(self.s_range[1] - self.s_range[0], c.block)

    def write_secondary(self, streams: Any, *, host_wait: bool) -> None:
        """Write this rank's ``secondary_range`` chunk of the full weight in the secondary codec,
        asynchronously into a fresh (uninitialized) buffer (``streams.copy_async``); ``host_wait`` blocks
        the host right after the copy (DeepSpeed's fix), else the consumer waits for it."""
        codec = self.comm.secondary
        lo, hi = self.s_range
        src = self.full[lo:hi]
        on_cpu = not streams.on_device
        if on_cpu:
            # The emulated engine must not read the full buffer after the host freed it; a device copy
            # is protected by record_stream instead (streams.copy_async).
            src = src.detach().clone()
        # on the CPU a poisoned buffer: a read before the copy lands yields NaN
        dst = codec.encoded_empty(hi - lo, self.device, poison=on_cpu)
        holder = streams.copy_async(
            f"secondary partition of {self.name}", dst, lambda: codec.encode_into(dst, src), self.full
        )
        if host_wait:
            holder.host_wait()
            holder.waited = True
        self.secondary = holder

    def settle_secondary(self) -> None:
        """On a device: order the current stream after this unit's secondary-partition write, which reads
        the full buffer on the copy stream. A writer of that buffer (the optimizer's update, where the
        parameter shard is the full buffer) must not overwrite it under the copy; the backward's gather
        orders it already where it consumed the partition. On the CPU the copy reads a clone: nothing to do."""
        held = self.secondary
        if held is not None and not held.waited and self.device.type == "cuda":
            held.wait()

    # -- views and storage ------------------------------------------------------------------------------
    def settle_params(self, stream: Any = None) -> None:
        """Land the post-step parameter all-gather still in flight, ordered before later work on ``stream``
        (default: the current stream; on CPU it blocks until the gather arrived)."""
        land, self.param_update = self.param_update, None
        if land is not None:
            land(stream)

    def set_views(self) -> None:
        """Point every parameter's ``.data`` at its slice of the full buffer."""
        for s in self.slots:
            s.param.data = self.full[s.offset : s.offset + s.numel].view(s.shape)

    def alloc_full(self) -> None:
        """Give the full buffer its storage back (contents undefined until an all-gather fills it)."""
        storage = self.full.untyped_storage()
        nbytes = self.padded * self.full.element_size()
        if storage.size() != nbytes:
            storage.resize_(nbytes)

    def free_full(self) -> None:
        """Drop the full weights' storage (views stay valid objects; see the module note)."""
        if not self.sharded:
            return
        self.full.untyped_storage().resize_(0)
        self.state = UnitState.SHARDED

    def is_allocated(self) -> bool:
        return self.full.untyped_storage().size() > 0

    # -- gradients ------------------------------------------------------------------------------------
    def flat_grad(self, dtype: torch.dtype, stream: Any = None) -> torch.Tensor:
        """The unit's gradients as one padded flat buffer in ``dtype`` (zeros where a parameter has no
        gradient or is frozen); the parameters' ``.grad`` are released. ``stream``: the (device) stream
        that copies them, which must finish before their memory is reused."""
        flat = torch.zeros(self.padded, dtype=dtype, device=self.device)
        for s in self.slots:
            g = s.param.grad
            if g is not None:
                flat[s.offset : s.offset + s.numel].copy_(g.reshape(-1))
                if stream is not None:
                    g.record_stream(stream)
                s.param.grad = None
        return flat

    def masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element (decay, trainable) masks of this rank's optimizer chunk, as fp32 0/1."""
        lo, hi = self.o_range
        decay = torch.zeros(hi - lo, dtype=torch.float32, device=self.device)
        trainable = torch.zeros(hi - lo, dtype=torch.float32, device=self.device)
        for s in self.slots:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a < b:
                if s.decay:
                    decay[a - lo : b - lo] = 1.0
                if s.trainable:
                    trainable[a - lo : b - lo] = 1.0
        return decay, trainable

    def runs(self, keep: Any) -> list[tuple[int, int]]:
        """The runs of this rank's optimizer chunk covered by the parameter slots ``keep(slot)`` selects,
        as ``(start, end)`` offsets in the chunk (adjacent runs merged; a few per unit, so the optimizer
        keeps no per-element mask)."""
        lo, hi = self.o_range
        runs: list[tuple[int, int]] = []
        for s in self.slots:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a < b and keep(s):
                if runs and runs[-1][1] == a - lo:
                    runs[-1] = (runs[-1][0], b - lo)
                else:
                    runs.append((a - lo, b - lo))
        return runs

    # -- relative offsets --------------------------------------------------------------------------------
    @property
    def optim_in_param(self) -> tuple[int, int]:
        """The optimizer chunk as a slice of the parameter shard."""
        return self.o_range[0] - self.p_range[0], self.o_range[1] - self.p_range[0]

    @property
    def optim_in_grad(self) -> tuple[int, int]:
        """The optimizer chunk as a slice of the gradient shard."""
        return self.o_range[0] - self.g_range[0], self.o_range[1] - self.g_range[0]

    def __repr__(self) -> str:
        return f"FlatUnit({self.name!r}, numel={self.numel}, padded={self.padded}, {self.state.value})"


def check_nesting(unit: FlatUnit) -> None:
    """The shard layout invariant at run time: optimizer range ⊆ gradient range ⊆ parameter range."""
    (po, pe), (go, ge), (oo, oe) = unit.p_range, unit.g_range, unit.o_range
    if not (po <= go <= oo < oe <= ge <= pe):
        raise AssertionError(
            f"unit {unit.name!r}: shard layout broken: optim {unit.o_range} must lie in grads "
            f"{unit.g_range} which must lie in params {unit.p_range} (degrees {unit.degrees})"
        )


def collect_units(root: nn.Module, units: list[tuple[str, nn.Module]] | None) -> list[tuple[str, nn.Module]]:
    """The default units: each child of every ``nn.ModuleList`` and every other top-level child with
    parameters (in registration order), plus the root for stray parameters (added by the caller)."""
    if units is not None:
        for name, module in units:
            if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                raise ZerotopoError(
                    f"unit {name!r} is a {type(module).__name__}, which is never called: the engine gathers a "
                    f"unit's weights in its forward hooks; pass its children as units instead"
                )
        return list(units)
    out: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module, top: bool) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, nn.ModuleList):
                for i, sub in enumerate(child):
                    out.append((f"{path}.{i}", sub))
            elif top and any(True for _ in child.parameters()):
                out.append((path, child))

    visit("", root, True)
    return out


def assign_params(
    root: nn.Module, units: list[tuple[str, nn.Module]]
) -> tuple[list[tuple[str, nn.Module, list[tuple[str, nn.Parameter]]]], list[tuple[str, nn.Parameter]]]:
    """Give every parameter to exactly one unit; returns (units with their params, stray params).

    A parameter reachable from two units (tied weights, e.g. an output projection that reuses the input
    embedding) belongs to the first unit that reaches it, in unit order; the later units *borrow* it
    (see :func:`unit_borrows` and [Note: tied parameters]).
    """
    # Parameters keep the names the root module gives them, so full state dicts load into the plain model.
    root_name = {id(p): n for n, p in root.named_parameters()}
    owner: dict[int, str] = {}
    result = []
    for uname, module in units:
        params = []
        for pname, p in module.named_parameters(remove_duplicate=True):
            if id(p) in owner:
                continue  # tied: owned by an earlier unit, borrowed here
            owner[id(p)] = uname
            params.append((root_name.get(id(p), f"{uname}.{pname}"), p))
        result.append((uname, module, params))
    stray = [(n, p) for n, p in root.named_parameters() if id(p) not in owner]
    return result, stray


def unit_borrows(units: list[tuple[str, nn.Module, list[tuple[str, nn.Parameter]]]]) -> dict[str, list[str]]:
    """For each unit (as :func:`assign_params` returns them) the earlier units whose parameters its module
    also uses (tied weights), in unit order; units that borrow nothing are left out.

    [Note: tied parameters] A parameter shared by two units is flattened, sharded, reduced and stepped
    once, in the unit that owns it. The borrowing unit's forward and backward need the owner's full
    weights too: the runtime gathers the owner with the borrower (and prefetches it with it), keeps it
    gathered until the borrower's gradients are reduced, and then frees it unless the owner's own backward
    is under way. Autograd sums the gradients of both uses into the one parameter before its
    post-accumulate hook runs, so the owner's gradient shard holds the sum of both uses.
    """
    owner = {id(p): uname for uname, _, params in units for _, p in params}
    order = [uname for uname, _, _ in units]
    out: dict[str, list[str]] = {}
    for uname, module, params in units:
        own = {id(p) for _, p in params}
        used = {owner[id(p)] for p in module.parameters() if id(p) not in own and id(p) in owner}
        if not used:
            continue
        if not params:
            raise ZerotopoError(
                f"unit {uname!r} has no parameters of its own and only reuses those of unit(s) "
                f"{', '.join(sorted(used))} (tied weights); pass units= that put its module in one of them"
            )
        out[uname] = [n for n in order if n in used]
    return out


def flatten_params(slots: list[ParamSlot], padded: int, device: torch.device) -> torch.Tensor:
    """The parameters' values as one padded fp32 buffer on ``device`` (zeros in the padding)."""
    flat = torch.zeros(padded, dtype=torch.float32, device=device)
    with torch.no_grad():
        for s in slots:
            flat[s.offset : s.offset + s.numel].copy_(s.param.detach().reshape(-1))
    return flat


def reset_by_modules(module: nn.Module) -> None:
    """Initialize a unit as its modules' constructors do: ``reset_parameters()`` of each submodule, in
    registration order (for torch layers this consumes the random generator exactly as building them
    eagerly did)."""
    covered: set[int] = set()
    for m in module.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
            covered.update(id(p) for p in m.parameters())
    for name, p in module.named_parameters():
        if id(p) not in covered:
            raise ZerotopoError(
                f"parameter {name!r} was built on the meta device and no module of its unit has "
                f"reset_parameters() to initialize it; give the model an init_unit(module) method or pass "
                f"init= to parallelize"
            )


def materialize_meta(
    root: nn.Module,
    unit_name: str,
    module: nn.Module | None,
    params: list[tuple[str, nn.Parameter]],
    padded: int,
    init: Any,
) -> tuple[torch.Tensor, list[tuple[str, nn.Parameter]]]:
    """Give a unit built on the meta device its values: one padded fp32 buffer on the CPU, whose slices
    become the unit's parameters (new ``nn.Parameter`` objects set on their modules), filled in place by
    ``init(module)``. Only this unit is allocated; the CPU's default generator is consumed as ``init``
    consumes it, so materializing units in order reproduces an eager build with the same seed."""
    metas = [p.is_meta for _, p in params]
    if not any(metas):
        return None, params  # type: ignore[return-value]
    if not all(metas):
        raise ZerotopoError(
            f"unit {unit_name!r} mixes parameters on the meta device with materialized ones; build the whole "
            f"unit on the meta device or not at all"
        )
    if module is None:
        raise ZerotopoError(
            f"parameters {', '.join(n for n, _ in params)} were built on the meta device but belong to no "
            f"unit module, so nothing can initialize them; materialize them before parallelize"
        )
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in root.modules():  # a tied parameter has several owners; every one gets the new parameter
        for attr, p in m._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((m, attr))
    flat = torch.zeros(padded, dtype=torch.float32)
    out: list[tuple[str, nn.Parameter]] = []
    offset = 0
    for name, p in params:
        n = p.numel()
        # A fresh parameter whose .data is set to the view: it keeps its own version counter (one made
        # from the view would share the buffer's, and every later all-gather into it would look to
        # autograd like an in-place change of saved weights).
        real = nn.Parameter(torch.empty(0), requires_grad=p.requires_grad)
        real.data = flat[offset : offset + n].view(p.shape)
        for owner, attr in owners[id(p)]:
            setattr(owner, attr, real)
        out.append((name, real))
        offset += n
    with torch.no_grad():
        init(module)
    return flat, out


def memory_bytes(
    units: list[FlatUnit], secondary_bytes: int, optim_bytes_per_element: int = 12
) -> dict[str, int]:
    """Bytes this rank holds per state (the full, gathered buffers are transient and not counted);
    ``optim_bytes_per_element``: fp32 master and the optimizer's per-element states (AdamW: 12)."""
    params = sum(u.param_shard.numel() * u.param_shard.element_size() for u in units)
    grads = sum(u.grad_shard.numel() * u.grad_shard.element_size() for u in units)
    optim = sum((u.o_range[1] - u.o_range[0]) * optim_bytes_per_element for u in units)
    return {"params": params, "secondary": secondary_bytes, "grads": grads, "optim": optim}
