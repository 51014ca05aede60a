"""The sharded optimizer: cross-replica gradient reduction, norm and clipping, a torch optimizer (AdamW
by default) on fp32 master shards, the post-step parameter all-gather, and fp16 loss scaling.

[Note: step] After the last micro-batch each rank holds, per unit, an fp32 gradient shard summed over
its gradient group. ``optimizer.step()`` then, per unit in unit order:

1. reduces it across the gradient group's replicas (the runtime runs the schedule's ``replica`` entry,
   :meth:`~zerotopo.engine.runtime.Runtime.replica_grads`): ``allreduce`` (all-reduce the whole shard over
   ``grad_replicas``, keep the optimizer sub-chunk: the papers' select-and-drop) or ``reduce_scatter``
   (reduce-scatter over ``optim_scatter`` into the optimizer chunk, all-reduce over ``optim_replicas``),
   and divides by the world size (the data-parallel mean; the user divides the loss by the micro-batch
   count);
2. once: the global gradient norm (squares summed over this rank's optimizer chunks, all-reduced over
   one ``optim`` group, so each element is counted once), the fp16 overflow flag (max over the world);
3. clips, runs the torch optimizer on the fp32 master chunk (see [Note: torch's optimizer on the
   shards]), casts it to the parameter dtype and all-gathers the chunks over ``param_gather`` back into
   the parameter shard, placed by ``layout.param_gather_order``.

[Note: torch's optimizer on the shards] Each unit's master chunk is cut into the runs its parameters
cover (views of the flat chunk), grouped by weight decay; frozen parameters and padding are left out,
so they never move. The optimizer is torch's own class from the table in
:mod:`zerotopo.config.optimizers` (AdamW, NeoX's Adam = AdamW, SGD, Adagrad, Adadelta, RMSprop, Adamax,
NAdam, RAdam: the elementwise ones, see [Note: elementwise optimizers] there); each per-element state
(``exp_avg``, ``momentum_buffer``, ``sum``, ...) is a flat buffer per unit, laid out as the master
chunk, and torch's state of each run is a view of it, so the flat ``master`` and ``states`` lists stay
the checkpoint's state for every type. It runs with ``fused=True`` where torch has a fused kernel of the
class on the device (AdamW and SGD on CUDA and the CPU, Adagrad on the CPU and CUDA: the fp16 step then
passes the overflow flag as its ``found_inf``, and the kernel skips the update on the device without
the host reading the flag, docs/engine.md, "Synchronization", rule 3) and ``foreach=True`` elsewhere (where
the host reads the
flag and skips the step).

[Note: lazy parameter gather] A sharded unit's (``p > 1``) parameter shard is read only by the unit's
next all-gather, so the step issues its ``param_gather`` all-gather asynchronously and leaves it in
flight (``FlatUnit.param_update``); the runtime lands it just before that next gather reads the shard
(``FlatUnit.settle_params``). The post-step gathers of the later units then run beside the next step's
forward instead of after the step. Units with ``p = 1`` (whose shard is the full weight the forward
computes with) are gathered at once. ``lazy_param_gather = False`` gathers every unit at once; the results
are bit-identical either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zerotopo.comm import collectives as C
from zerotopo.config.optimizers import is_muon, spec_for
from zerotopo.engine.optim_torch import (
    TorchOnShards,
    _fused_supported,
    resolve_optimizer,
)
from zerotopo.engine.units import FlatUnit, default_no_decay
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout


def _permute_chunks(buf: torch.Tensor, order: list[int], n: int) -> None:
    """Move chunk ``pos`` of ``buf`` (``n`` elements each) to chunk ``order[pos]``, in place: each cycle
    of the permutation is walked backwards with one chunk of scratch."""
    inv = [0] * len(order)
    for pos, sub in enumerate(order):
        inv[sub] = pos
    done = [False] * len(order)
    for start in range(len(order)):
        if done[start] or inv[start] == start:
            done[start] = True
            continue
        tmp = buf[start * n : (start + 1) * n].clone()
        j = start
        while True:
            done[j] = True
            src = inv[j]
            if src == start:
                buf[j * n : (j + 1) * n].copy_(tmp)
                break
            buf[j * n : (j + 1) * n].copy_(buf[src * n : (src + 1) * n])
            j = src


class LossScaler:
    """Dynamic (or static) loss scale for fp16, with DeepSpeed's semantics: an overflow skips the step
    and, once ``hysteresis`` overflows were seen since the last reduction, halves the scale (never below
    ``min_scale``); ``growth_interval`` steps without overflow double it (DeepSpeed's
    ``loss_scale_window``).

    [Note: scaler on the device] The state (scale, good steps, hysteresis left) lives in tensors on the
    optimizer's device and :meth:`update` takes the overflow flag as a tensor, so the whole update is
    ``torch.where`` on the device and the host never reads the flag (docs/engine.md, "Synchronization",
    rule 3). Read
    :attr:`scale` (a 0-d tensor) on the host only at the logging interval. ``update`` also takes a bool,
    and the state reads back as Python numbers in :meth:`state_dict`.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        *,
        dynamic: bool = True,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        min_scale: float = 1.0,
        device: torch.device | str = "cpu",
    ) -> None:
        if not (init_scale > 0 and min_scale > 0 and growth_interval >= 1 and hysteresis >= 1):
            raise ZerotopoError(
                f"loss scaler: need init_scale > 0, min_scale > 0, growth_interval >= 1 and hysteresis >= 1, "
                f"got {init_scale}, {min_scale}, {growth_interval}, {hysteresis}"
            )
        self.dynamic = dynamic
        self.growth_interval = int(growth_interval)
        self.hysteresis = int(hysteresis)
        self.min_scale = float(min_scale)
        self._scale = torch.tensor(float(init_scale), dtype=torch.float32, device=device)
        self._good = torch.zeros((), dtype=torch.int64, device=device)
        self._hyst = torch.tensor(self.hysteresis, dtype=torch.int64, device=device)

    def to(self, device: torch.device | str) -> LossScaler:
        """Move the state to ``device`` (the optimizer does, once, at construction)."""
        self._scale, self._good, self._hyst = (t.to(device) for t in (self._scale, self._good, self._hyst))
        return self

    @property
    def scale(self) -> torch.Tensor:
        """The current scale, a 0-d fp32 tensor on the device (updated in place by :meth:`update`)."""
        return self._scale

    @property
    def good_steps(self) -> torch.Tensor:
        return self._good

    @property
    def hysteresis_left(self) -> torch.Tensor:
        return self._hyst

    def update(self, overflow: bool | torch.Tensor) -> None:
        """One step's update; ``overflow`` a bool or a tensor (nonzero: overflow), read on the device."""
        if not self.dynamic:
            return
        found = torch.as_tensor(overflow, device=self._scale.device).reshape(()).bool()
        # Overflow: halve once the hysteresis is used up (it then stays), else use one unit of it.
        halve = found & (self._hyst <= 1)
        halved = torch.clamp(self._scale / 2.0, min=self.min_scale)
        # No overflow: count the good step; each full window doubles the scale and restores the hysteresis.
        good = self._good + 1
        grow = ~found & (good % self.growth_interval == 0)
        new_scale = torch.where(halve, halved, torch.where(grow, self._scale * 2.0, self._scale))
        hyst = torch.where(
            found,
            torch.where(halve, self._hyst, self._hyst - 1),
            torch.where(grow, torch.full_like(self._hyst, self.hysteresis), self._hyst),
        )
        self._scale.copy_(new_scale)
        self._hyst.copy_(hyst)
        self._good.copy_(torch.where(found, torch.zeros_like(good), good))

    def state_dict(self) -> dict[str, Any]:
        """Python numbers (reads the device: call it at checkpoints only)."""
        return {
            "scale": float(self._scale),
            "good_steps": int(self._good),
            "hysteresis_left": int(self._hyst),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self._scale.fill_(float(sd["scale"]))
        self._good.fill_(int(sd["good_steps"]))
        self._hyst.fill_(int(sd.get("hysteresis_left", self.hysteresis)))


def make_scaler(
    loss_scale: str | float | None, param_dtype: torch.dtype, **options: Any
) -> LossScaler | None:
    """``"dynamic"`` scales only fp16 parameters (bf16/fp32 need no scaling); a number is a static scale.

    ``options`` are :class:`LossScaler` keywords (``init_scale``, ``growth_interval``, ``hysteresis``,
    ``min_scale``), as a NeoX ``fp16`` block sets them (see ``zerotopo.config.tree.FP16Config.scaler_options``)."""
    if loss_scale is None:
        return None
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ZerotopoError(f"loss_scale must be 'dynamic', a number or None, got {loss_scale!r}")
        return LossScaler(**options) if param_dtype == torch.float16 else None
    if not loss_scale > 0:
        raise ZerotopoError(f"a static loss_scale must be > 0, got {loss_scale!r}")
    return LossScaler(float(loss_scale), dynamic=False)


class ShardedOptimizer(TorchOnShards, torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` over the fp32 master shards of a model sharded by
    :func:`~zerotopo.engine.api.parallelize`, running torch's own class on them.

    ::

        optimizer = ShardedOptimizer(model, torch.optim.AdamW, lr=3e-4, betas=(0.9, 0.95),
                                     weight_decay=0.1, max_grad_norm=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)

    ``optimizer_class``: an elementwise class of the table in :mod:`zerotopo.config.optimizers`
    (``torch.optim.AdamW``, ``SGD``, ``Adagrad``, ``Adadelta``, ``RMSprop``, ``Adamax``, ``NAdam``,
    ``RAdam``) or its name there (``"Adam"`` is NeoX's Adam, AdamW). ``hyperparameters``: the class's
    own keywords besides ``lr`` and ``weight_decay`` (``betas``, ``eps``, ``momentum``, ...; ``betas``
    and ``eps`` default to NeoX's ``(0.9, 0.95)`` and ``1e-8`` for the types that take them). A type or
    keyword the table does not know is a :class:`ZerotopoError`.

    ``no_decay(name, param)``: parameters without weight decay (default: NeoX's rule, every parameter
    with ``ndim < 2``). ``max_grad_norm``: clip the global gradient norm (None or 0: no clipping).
    ``loss_scale``: ``"dynamic"`` scales fp16 models only (a :class:`LossScaler` with its defaults), a
    number is a static scale, a :class:`LossScaler` is used as given, None disables scaling.

    ``param_groups[0]`` holds the hyperparameters, so torch's LR schedulers drive ``lr`` (a 0-d tensor
    is taken as well). Its ``params`` are this rank's fp32 master chunks, one per unit (``master[i]``);
    ``states[name][i]`` is unit ``i``'s flat buffer of the per-element state ``name`` (Adam's
    ``exp_avg``, SGD's ``momentum_buffer``, ...), laid out as ``master[i]``. :meth:`step` returns
    ``{"grad_norm", "skipped", "loss_scale"}``.

    ``optimizer_class`` ``torch.optim.Muon`` (or ``"Muon"``) builds
    :class:`~zerotopo.engine.muon.MuonOnShards` instead: Muon on the layers' matrices and an elementwise
    aux optimizer on the rest."""

    def __new__(cls, model: Any = None, optimizer_class: Any = torch.optim.AdamW, *args: Any, **kwargs: Any):
        if cls is ShardedOptimizer and is_muon(_optimizer_name(optimizer_class)):
            from zerotopo.engine.muon import MuonOnShards

            cls = MuonOnShards
        return super().__new__(cls)

    def __init__(
        self,
        model: Any,
        optimizer_class: type[torch.optim.Optimizer] | str = torch.optim.AdamW,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = None,
        no_decay: Callable[[str, torch.Tensor], bool] = default_no_decay,
        loss_scale: LossScaler | str | float | None = "dynamic",
        **hyperparameters: Any,
    ) -> None:
        state = shard_state(model)
        if state.optimizer is not None:
            raise ZerotopoError("this model already has a ShardedOptimizer; build one per parallelized model")
        units, mesh, runtime = state.units, state.mesh, state.runtime
        self.units = units
        self.mesh = mesh
        self.degrees = mesh.degrees
        self.plan = mesh.plan
        self.runtime = runtime
        self.ledger = runtime.ledger
        self.max_grad_norm = max_grad_norm
        self.spec, hyper = resolve_optimizer(_optimizer_name(optimizer_class), hyperparameters)
        scaler = (
            loss_scale if isinstance(loss_scale, LossScaler) else make_scaler(loss_scale, state.param_dtype)
        )
        self.scaler = scaler
        for u in units:
            for s in u.slots:
                s.decay = not no_decay(s.name, s.param)
        # Steps applied: on the host without loss scaling; on the device with it, where a skipped
        # (overflowed) step is known only to the device (see the step property).
        self._host_steps = 0
        self._device_steps = torch.zeros((), dtype=torch.float64, device=mesh.device)
        if scaler is not None:
            scaler.to(mesh.device)
        self.master = [u.initial_master for u in units]
        for u in units:
            del u.initial_master
        defaults = {"lr": lr, **hyper, "weight_decay": weight_decay}
        torch.optim.Optimizer.__init__(self, [{"params": self.master}], defaults)
        self.states = {
            n: [torch.full_like(m, self.spec.initial_value(n, hyper)) for m in self.master]
            for n in self.spec.state_names(hyper)
        }
        # A trainable mask (for the gradient norm) only for chunks with frozen parameters or padding,
        # decided once here: a per-step ``train.all()`` would make the host wait on the device.
        trainable = [u.masks()[1].bool() for u in units]
        self.trainable = [None if bool(t.all()) else t for t in trainable]
        self.frozen_runs = [u.runs(lambda s: not s.trainable) for u in units]
        # torch's optimizer on views of the flat shards (see [Note: torch's optimizer on the shards])
        self.fused = _fused_supported(mesh.device, self.spec) and not (
            scaler is not None and self.spec.first_from_grad(hyper)
        )
        self.pieces: list[list[tuple[torch.Tensor, int]]] = [[] for _ in units]
        """Per unit: each view the torch optimizer holds and its offset in the master chunk."""
        self.optims = [self._torch_optimizer(i, u) for i, u in enumerate(units)]
        self.pg_order = layout.param_gather_order(self.degrees)
        self.lazy_param_gather = True
        """Leave sharded units' post-step all-gathers in flight until their next use (see the note)."""
        state.optimizer, state.scaler = self, scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the fp16 loss scale (unchanged without loss scaling)."""
        return loss * self.scaler.scale if self.scaler is not None else loss

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused after construction: the groups are the model's master shards (weight decay per
        parameter is ``no_decay``'s)."""
        if getattr(self, "param_groups", None):
            raise ZerotopoError(
                "ShardedOptimizer has one parameter group, the model's master shards; set weight decay per "
                "parameter with no_decay=, and hyperparameters in param_groups[0]"
            )
        super().add_param_group(param_group)

    def _apply(self, i: int, grad: torch.Tensor, found_inf: torch.Tensor | None = None) -> None:
        """One step of unit ``i`` with ``grad`` (its fp32 optimizer chunk of the gradient), the
        hyperparameters of ``param_groups[0]``; ``found_inf`` (fused only) skips it on the device."""
        opt = self.optims[i]
        g, hyper = self.param_groups[0], self._hyper()  # once per unit: the groups, frozen fill, adoption
        if opt is not None:
            for group in opt.param_groups:
                group.update(hyper)
                group["weight_decay"] = g["weight_decay"] if group["decay"] else 0.0
            for v, a in self.pieces[i]:
                v.grad = grad[a : a + v.numel()]
            opt.found_inf = found_inf  # read by the fused kernel only
            opt.step()
            for v, _ in self.pieces[i]:
                v.grad = None
            self._adopt_created(i, hyper)
        # Frozen parameters never move and keep their initial state (torch skips parameters without a
        # gradient).
        if self.frozen_runs[i]:
            for name, bufs in self.states.items():
                fill = self.spec.initial_value(name, hyper)
                for a, b in self.frozen_runs[i]:
                    bufs[i][a:b].fill_(fill)

    # -- the step ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict[str, Any]:
        """Reduce, clip and apply the optimizer; returns ``{"grad_norm", "skipped", "loss_scale"}``.

        Nothing here makes the host wait on the device (docs/engine.md, "Synchronization", rule 3):
        ``grad_norm`` is a 0-d tensor
        on the device (``inf`` when an fp16 overflow skipped the step); with loss scaling ``skipped`` and
        ``loss_scale`` are 0-d device tensors too. Read them at the logging interval."""
        if self.scaler is not None:
            return self._scaled_step(self.scaler)
        grads = self.runtime.replica_grads()
        inv = 1.0 / self.degrees.world
        sq = torch.zeros(1, dtype=torch.float32, device=self.mesh.device)
        for g, t in zip(grads, self.trainable):
            g.mul_(inv)
            sq += (g if t is None else g * t).pow(2).sum()
        if self.degrees.optim > 1:
            C.all_reduce(sq, self.mesh.group("optim"), ledger=self.ledger, tag="grad_norm")
        # The norm and the clipping factor stay on the device: no host wait per step.
        norm = sq.sqrt().squeeze(0)
        coef = self._clip_coef(norm)
        self._host_steps += 1
        if coef is not None:
            for g in grads:
                g.mul_(coef)
        self._before_apply(grads)
        for i, u in enumerate(self.units):
            self._apply(i, grads[i])
            self._gather_params(u, self.master[i], lazy=self.lazy_param_gather)
        self.runtime.invalidate_secondaries()
        return {"grad_norm": norm, "skipped": False, "loss_scale": 1.0}

    owned_bytes: int = 0
    """Optimizer-state bytes this rank holds beyond the chunks (Muon's owned matrices; none here)."""

    def sync_shards(self) -> None:
        """Collective: make ``master`` and ``states`` hold this rank's whole optimizer state over its
        chunks, as checkpoints store it (they always do for elementwise types; Muon copies its owners'
        state in, :mod:`zerotopo.engine.muon`)."""

    def shards_written(self) -> None:
        """Collective: ``master`` and ``states`` were written from outside (a full state dict); take them
        as the state (nothing to do for elementwise types; Muon hands the matrices to their owners)."""

    def _before_apply(self, grads: list[torch.Tensor]) -> None:
        """Work across units between clipping and the per-unit updates (none for elementwise types;
        Muon's whole-matrix exchange, :mod:`zerotopo.engine.muon`)."""

    def _clip_coef(self, norm: torch.Tensor) -> torch.Tensor | None:
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            return (self.max_grad_norm / (norm + 1e-6)).clamp_(max=1.0)
        return None

    def _scaled_step(self, scaler: LossScaler) -> dict[str, Any]:
        """The fp16 step (see [Note: scaler on the device]): unscale and check for overflow with torch's
        AMP kernel, agree on the flag over the world, update the scale, and apply the step with every
        state change multiplied or selected by the flag, so an overflow leaves the state bit for bit
        unchanged without the host ever reading the flag."""
        grads = self.runtime.replica_grads()
        device = self.mesh.device
        found = torch.zeros(1, dtype=torch.float32, device=device)
        inv_scale = (scaler.scale * float(self.degrees.world)).reciprocal().reshape(1)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
        sq = torch.zeros(1, dtype=torch.float32, device=device)
        for g, t in zip(grads, self.trainable):
            sq += (g if t is None else g * t).pow(2).sum()
        if self.degrees.optim > 1:
            C.all_reduce(sq, self.mesh.group("optim"), ledger=self.ledger, tag="grad_norm")
        # Finite gradients whose squares overflow fp32 count as an overflow too.
        flag = torch.maximum(found, (~torch.isfinite(sq)).to(torch.float32))
        if self.degrees.world > 1:
            C.all_reduce(flag, self.mesh.group("world"), op="max", ledger=self.ledger, tag="overflow")
        overflow = (flag > 0).squeeze(0)  # 0-d bool on the device
        scaler.update(overflow)
        keep = (~overflow).to(torch.float32)
        norm = torch.where(overflow, torch.full_like(sq, float("inf")), sq).sqrt().squeeze(0)
        coef = self._clip_coef(torch.where(overflow, torch.zeros_like(norm), norm))
        self._device_steps += keep.to(self._device_steps.dtype)
        # fused: the kernel skips on the flag, on the device; else the host reads it (on the CPU it is
        # the device)
        apply = True if self.fused else not bool(overflow)
        for i, u in enumerate(self.units):
            grads[i].masked_fill_(overflow, 0.0)  # NaN/Inf must not reach the moments, even times zero
            if coef is not None:
                grads[i].mul_(coef)
            if apply:
                self._apply(i, grads[i], flag.reshape(()) if self.fused else None)
            self._gather_params(u, self.master[i], lazy=self.lazy_param_gather)
        self.runtime.invalidate_secondaries()
        return {"grad_norm": norm, "skipped": overflow, "loss_scale": scaler.scale.clone()}

    @property
    def step_count(self) -> int:
        """Optimizer steps applied (skipped fp16 steps not counted; reads the device with a scaler)."""
        if self.scaler is not None:
            return int(self._device_steps)
        return self._host_steps

    @step_count.setter
    def step_count(self, value: int) -> None:
        self._host_steps = int(value)
        self._device_steps.fill_(int(value))
        self._set_torch_steps(int(value))

    def _gather_params(self, u: FlatUnit, master: torch.Tensor, *, lazy: bool = False) -> None:
        """Cast the updated chunk and all-gather the chunks of this rank's parameter shard; ``lazy``
        leaves a sharded unit's gather in flight until its next use (see [Note: lazy parameter gather])."""
        u.settle_params()  # an earlier update still in flight lands first
        u.settle_secondary()  # and the secondary partition's copy has read the buffer written below
        chunk = master.to(u.param_dtype)
        colls = u.comm.steps.param_gather  # the schedule's: empty when o = p
        if not colls:
            lo, hi = u.optim_in_param
            u.param_shard[lo:hi].copy_(chunk)
            return
        # Gathered straight into the shard (chunks in group-position order), then put in place chunk by
        # chunk: no staging buffer, so gathers left in flight hold no memory beyond the shards themselves.
        pending = C.all_gather(
            u.param_shard, chunk, self.mesh.group(colls[0].group), ledger=self.ledger, async_op=True,
            tag=f"params {u.name}",
        )  # fmt: skip
        n, order = chunk.numel(), self.pg_order

        def land(stream: Any) -> None:
            pending.wait(stream)
            with C.stream_context(stream, u.device):
                _permute_chunks(u.param_shard, order, n)

        if lazy and u.sharded:
            u.param_update = land
        else:
            land(None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every gradient shard (the shards are kept: they accumulate the next step)."""
        self.runtime.take_started_reductions()  # a skipped step's started reductions: finished and dropped
        for u in self.units:
            u.grad_shard.zero_()
            for s in u.slots:
                s.param.grad = None

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the optimizer state, in torch's layout: ``state[i]`` is unit ``i``'s
        (``param_groups[0]["params"][i]``, the master chunk) ``{"step", "master", <per-element states>,
        "unit", "range"}``, ``param_groups`` the hyperparameters with the parameters' indices; besides
        torch's two keys, ``optimizer`` (the type), ``scalars`` (states such as NAdam's ``mu_product``)
        and ``loss_scaler``. Tensors are copies."""
        g = self.param_groups[0]
        step = self.step_count
        return {
            "state": {
                i: {
                    "step": step,
                    "unit": u.name,
                    "range": u.o_range,
                    "master": self.master[i].clone(),
                    **{name: bufs[i].clone() for name, bufs in self.states.items()},
                }
                for i, u in enumerate(self.units)
            },
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": list(range(len(self.units)))}
            ],
            "optimizer": self.spec.name,
            "scalars": self.scalar_state(),
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a shard written by :meth:`state_dict` on the same rank, plan, model and optimizer type
        (a state without ``optimizer`` is AdamW's, as written before the type was recorded). The layout
        keyed by unit name (``{"step", "units": {name: {...}}, ...}``, written before the optimizer was a
        ``torch.optim.Optimizer``) loads too."""
        sd = _by_unit(state_dict)
        saved = spec_for(sd.get("optimizer", "AdamW"))
        if saved.name != self.spec.name:
            raise ZerotopoError(
                f"the optimizer state was written by {saved.name}, this run's optimizer is {self.spec.name}; "
                f"train with optimizer type {saved.name}, or start a fresh optimizer from the weights only"
            )
        for i, u in enumerate(self.units):
            if u.name not in sd["units"]:
                raise ZerotopoError(f"optimizer state has no unit {u.name!r}; it was saved for another model")
            s = sd["units"][u.name]
            if tuple(s["range"]) != tuple(u.o_range):
                raise ZerotopoError(
                    f"optimizer state of unit {u.name!r} covers elements {tuple(s['range'])}, this rank "
                    f"holds {u.o_range}: load it on the rank and plan that saved it"
                )
            missing = [name for name in self.states if name not in s]
            if missing:
                raise ZerotopoError(
                    f"optimizer state of unit {u.name!r} has no {', '.join(missing)}: it was written by "
                    f"{saved.name} with other hyperparameters (this run keeps {', '.join(self.states)})"
                )
            self.master[i].copy_(s["master"])
            for name, bufs in self.states.items():
                bufs[i].copy_(s[name])
            self._gather_params(u, self.master[i])
        for k, v in sd["param_groups"][0].items():
            if k != "params":
                self.param_groups[0][k] = tuple(v) if k == "betas" else v
        self.step_count = int(sd["step"])
        for i, opt in enumerate(self.optims):
            if opt is not None:
                self._bind_states(i, opt)  # step counts, fresh scalars, views (see _bind_states)
        self._set_scalars(sd.get("scalars") or {})
        if self.scaler is not None and sd.get("loss_scaler"):
            self.scaler.load_state_dict(sd["loss_scaler"])
        self.runtime.invalidate_secondaries()


def _by_unit(sd: dict[str, Any]) -> dict[str, Any]:
    """A state dict in the layout keyed by unit name: torch's layout (``state``/``param_groups``, from
    :meth:`ShardedOptimizer.state_dict`) converted, the older layout as it is."""
    if "units" in sd:
        return sd
    if "state" not in sd or "param_groups" not in sd:
        raise ZerotopoError(
            f"not a ShardedOptimizer state dict: it has keys {sorted(sd)}, expected state and param_groups"
        )
    units = {}
    for entry in sd["state"].values():
        entry = dict(entry)
        units[entry.pop("unit")] = entry
    steps = {int(e["step"]) for e in units.values()}
    return {
        "step": steps.pop() if steps else 0,
        "optimizer": sd.get("optimizer", "AdamW"),
        "scalars": sd.get("scalars"),
        "param_groups": sd["param_groups"],
        "loss_scaler": sd.get("loss_scaler"),
        "units": units,
    }


def shard_state(model: Any) -> Any:
    """What :func:`~zerotopo.engine.api.parallelize` attached to ``model``; a clear error for any other."""
    state = getattr(model, "_zerotopo", None)
    if state is None:
        raise ZerotopoError(
            f"ShardedOptimizer takes a model sharded by zerotopo.engine.parallelize, got {type(model).__name__}"
        )
    return state


def _optimizer_name(optimizer_class: type[torch.optim.Optimizer] | str) -> str:
    """The table's name for ``optimizer_class`` (a torch class or a name the table knows)."""
    if isinstance(optimizer_class, str):
        return optimizer_class
    if isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer):
        if optimizer_class is torch.optim.Adam:
            raise ZerotopoError(
                "torch.optim.Adam (weight decay added to the gradient) is not in the optimizer table; pass "
                "torch.optim.AdamW (decoupled weight decay, what GPT-NeoX's Adam runs)"
            )
        return optimizer_class.__name__
    raise ZerotopoError(
        f"optimizer_class must be a torch.optim.Optimizer subclass or its name, got {optimizer_class!r}"
    )
