"""The sharded optimizer: cross-replica gradient reduction, norm and clipping, AdamW on fp32 master
shards, the post-step parameter all-gather, and fp16 loss scaling.

[Note: step] After the last micro-batch each rank holds, per unit, an fp32 gradient shard summed over
its gradient group. ``optimizer.step()`` then, per unit in unit order:

1. reduces it across the gradient group's replicas: ``allreduce`` (all-reduce the whole shard over
   ``grad_replicas``, keep the optimizer sub-chunk: the papers' select-and-drop) or ``reduce_scatter``
   (reduce-scatter over ``optim_scatter`` into the optimizer chunk, all-reduce over ``optim_replicas``),
   and divides by the world size (the data-parallel mean; the user divides the loss by the micro-batch
   count);
2. once: the global gradient norm (squares summed over this rank's optimizer chunks, all-reduced over
   one ``optim`` group, so each element is counted once), the fp16 overflow flag (max over the world);
3. clips, runs AdamW (torch's formula, decoupled weight decay with a per-element mask) on the fp32 master
   chunk, casts it to the parameter dtype and all-gathers the chunks over ``param_gather`` back into the
   parameter shard, placed by ``layout.param_gather_order``.

[Note: lazy parameter gather] A sharded unit's (``p > 1``) parameter shard is read only by the unit's
next all-gather, so the step issues its ``param_gather`` all-gather asynchronously and leaves it in
flight (``FlatUnit.param_update``); the runtime lands it just before that next gather reads the shard
(``FlatUnit.settle_params``). The post-step gathers of the later units then run beside the next step's
forward instead of after the step. Units with ``p = 1`` (whose shard is the full weight the forward
computes with) are gathered at once. ``lazy_param_gather = False`` gathers every unit at once; the results
are bit-identical either way.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from zerotopo.comm import collectives as C
from zerotopo.comm.mesh import Mesh
from zerotopo.engine.units import FlatUnit
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
    ``torch.where`` on the device and the host never reads the flag (DESIGN.md rule 3). Read
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
    ``min_scale``), as a NeoX ``fp16`` block sets them (see ``NeoXArgs.loss_scaler_options``)."""
    if loss_scale is None:
        return None
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ZerotopoError(f"loss_scale must be 'dynamic', a number or None, got {loss_scale!r}")
        return LossScaler(**options) if param_dtype == torch.float16 else None
    if not loss_scale > 0:
        raise ZerotopoError(f"a static loss_scale must be > 0, got {loss_scale!r}")
    return LossScaler(float(loss_scale), dynamic=False)


class ShardedAdamW:
    """AdamW over the optimizer shards of every unit; ``param_groups[0]`` holds the hyperparameters
    (set ``param_groups[0]["lr"]`` for a schedule, as with torch optimizers)."""

    def __init__(
        self,
        units: list[FlatUnit],
        mesh: Mesh,
        runtime: Any,
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        max_grad_norm: float | None,
        scaler: LossScaler | None,
        ledger: Any,
    ) -> None:
        self.units = units
        self.mesh = mesh
        self.degrees = mesh.degrees
        self.plan = mesh.plan
        self.runtime = runtime
        self.ledger = ledger
        self.max_grad_norm = max_grad_norm
        self.scaler = scaler
        self.param_groups = [
            {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "params": []}
        ]
        # Steps applied: on the host without loss scaling; on the device with it, where a skipped
        # (overflowed) step is known only to the device (see the step property).
        self._host_steps = 0
        self._device_steps = torch.zeros((), dtype=torch.float64, device=mesh.device)
        if scaler is not None:
            scaler.to(mesh.device)
        self.master = [u.initial_master for u in units]
        for u in units:
            del u.initial_master
        self.exp_avg = [torch.zeros_like(m) for m in self.master]
        self.exp_avg_sq = [torch.zeros_like(m) for m in self.master]
        # Weight decay as runs of the chunk (no per-element mask: that would cost 4 bytes per element);
        # a trainable mask is kept only for chunks with frozen parameters or padding.
        self.decay_runs = [u.decay_runs() for u in units]
        trainable = [u.masks()[1].bool() for u in units]
        # Decided once here: a per-step ``train.all()`` would make the host wait on the device.
        self.all_trainable = [bool(t.all()) for t in trainable]
        self.trainable = [None if every else t for t, every in zip(trainable, self.all_trainable)]
        self.pg_order = layout.param_gather_order(self.degrees)
        self.os_order = layout.optim_scatter_order(self.degrees)
        # Step-end reductions start in the last backward (see [Note: last backward] in runtime.py).
        runtime.after_reduce = self._start_replica_reduce
        self.lazy_param_gather = True
        """Leave sharded units' post-step all-gathers in flight until their next use (see the note)."""

    # -- the step ---------------------------------------------------------------------------------------
    def _start_replica_reduce(self, u: FlatUnit) -> None:
        """The runtime's ``after_reduce``: ``u``'s gradient shard is final; reduce it across replicas now,
        beside the rest of the backward (device: the replica stream; CPU: the engine's worker thread)."""
        streams = self.runtime.streams
        u.replica_pending = streams.run_async(
            f"step-end reduction of {u.name}", lambda: self._replica_reduce(u), after=streams.reduce_scatter
        )

    def _take_started(self) -> dict[int, torch.Tensor]:
        """Wait for every reduction the last backward started and take them off their units (by unit
        position): the step's own collectives never interleave with them."""
        streams = self.runtime.streams
        done = {}
        for i, u in enumerate(self.units):
            holder, u.replica_pending = u.replica_pending, None
            if holder is not None:
                g = holder.wait(streams.current())
                if streams.on_device:
                    g.record_stream(streams.current())  # made on the replica stream, used and freed here
                done[i] = g
        return done

    def _replica_grads(self) -> list[torch.Tensor]:
        """Every unit's optimizer chunk of the world's gradient: the reductions the last backward started,
        then the rest."""
        self.runtime.wait_reductions()
        done = self._take_started()
        # upcast here, not in the backward: an fp32 copy of a 2-byte chunk would outlive the activations
        return [
            (done[i] if i in done else self._replica_reduce(u)).to(torch.float32)
            for i, u in enumerate(self.units)
        ]

    def _replica_reduce(self, u: FlatUnit) -> torch.Tensor:
        """This rank's optimizer chunk of the gradient summed over the whole world, in the gradient
        shard's dtype (fp32, or the parameter dtype under ``grad_dtype: param``); the step upcasts it.

        A chunk that is the gradient shard or a slice of it is returned as is, not copied (the step
        scales and clips an fp32 one in place, as ``clip_grad_norm_`` does ``.grad``; ``zero_grad``
        clears it), so the step holds no second copy of the gradients; the cost model counts a copy only
        where one is made (``zerotopo.cost.memory``: the reduce-scatter's chunks in ``buffers``, the
        fp32 upcast in ``step_buffers``)."""
        tag = f"replicas {u.name}"
        buf = u.grad_shard
        # the unit's ``replica`` entry of the schedule, in order: all-reduce (the papers' select-and-drop)
        # or reduce-scatter into the optimizer chunk, then all-reduce over its replicas
        for c in self.runtime.steps[u.index].replica:
            group = self.mesh.group(c.group)
            if c.op == "reduce_scatter":
                chunk = torch.empty(buf.numel() // group.size, dtype=buf.dtype, device=u.device)
                C.reduce_scatter(chunk, buf, group, order=self.os_order, ledger=self.ledger, tag=tag)
                buf = chunk
            else:
                C.all_reduce(buf, group, ledger=self.ledger, tag=tag)
        if buf is u.grad_shard:
            lo, hi = u.optim_in_grad
            return buf[lo:hi]
        return buf

    @torch.no_grad()
    def step(self) -> dict[str, Any]:
        """Reduce, clip and apply AdamW; returns ``{"grad_norm", "skipped", "loss_scale"}``.

        Nothing here makes the host wait on the device (DESIGN.md rule 3): ``grad_norm`` is a 0-d tensor
        on the device (``inf`` when an fp16 overflow skipped the step); with loss scaling ``skipped`` and
        ``loss_scale`` are 0-d device tensors too. Read them at the logging interval."""
        if self.scaler is not None:
            return self._scaled_step(self.scaler)
        grads = self._replica_grads()
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
        group = self.param_groups[0]
        for i, u in enumerate(self.units):
            if coef is not None:
                grads[i].mul_(coef)
            self._adamw(i, grads[i], group)
            self._gather_params(u, self.master[i], lazy=self.lazy_param_gather)
        self.runtime.invalidate_secondaries()
        return {"grad_norm": norm, "skipped": False, "loss_scale": 1.0}

    def _clip_coef(self, norm: torch.Tensor) -> torch.Tensor | None:
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            return (self.max_grad_norm / (norm + 1e-6)).clamp_(max=1.0)
        return None

    def _scaled_step(self, scaler: LossScaler) -> dict[str, Any]:
        """The fp16 step (see [Note: scaler on the device]): unscale and check for overflow with torch's
        AMP kernel, agree on the flag over the world, update the scale, and apply the step with every
        state change multiplied or selected by the flag, so an overflow leaves the state bit for bit
        unchanged without the host ever reading the flag."""
        grads = self._replica_grads()
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
        group = self.param_groups[0]
        for i, u in enumerate(self.units):
            grads[i].masked_fill_(overflow, 0.0)  # NaN/Inf must not reach the moments, even times zero
            if coef is not None:
                grads[i].mul_(coef)
            self._adamw_masked(i, grads[i], group, keep)
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

    def _adamw(self, i: int, grad: torch.Tensor, group: dict[str, Any]) -> None:
        """torch.optim.AdamW's single-tensor update, with per-element decay and trainable masks."""
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        p, m, v = self.master[i], self.exp_avg[i], self.exp_avg_sq[i]
        old = p.clone() if not self.all_trainable[i] else None
        if wd:
            # the same fp32 factor 1 - lr*wd as a per-element mask would give, on the decayed runs only
            self._decay(i, 1 - torch.tensor(lr * wd, dtype=torch.float32, device=p.device))
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        t = self._host_steps
        step_size = lr / (1 - b1**t)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
        self._freeze(i, old)

    def _adamw_masked(self, i: int, grad: torch.Tensor, group: dict[str, Any], keep: torch.Tensor) -> None:
        """:meth:`_adamw` with the step count on the device and every change scaled by ``keep`` (0 on an
        overflow): ``p * 1``, ``m + 0 * (0 - m)``, ``v * 1 + 0`` and ``p + 0`` leave the state exact."""
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        p, m, v = self.master[i], self.exp_avg[i], self.exp_avg_sq[i]
        old = p.clone() if not self.all_trainable[i] else None
        if wd:
            self._decay(i, 1 - (lr * wd) * keep)
        m.lerp_(grad, (1 - b1) * keep)
        v.mul_(torch.where(keep > 0, b2, 1.0)).addcmul_(grad, grad, value=1 - b2)  # grad is 0 when skipped
        t = self._device_steps.clamp(min=1)  # a first step that overflows has t = 0: keep is 0 anyway
        step_size = (lr / (1 - b1**t)) * keep.to(t.dtype)
        denom = (v.sqrt() / (1 - b2**t).sqrt().to(v.dtype)).add_(eps)
        p.addcdiv_(m * (-step_size).to(m.dtype), denom)
        self._freeze(i, old)

    def _decay(self, i: int, factor: torch.Tensor) -> None:
        """Multiply the decayed runs of master chunk ``i`` by ``factor`` (a 0-d fp32 tensor)."""
        p = self.master[i]
        for a, b in self.decay_runs[i]:
            p[a:b].mul_(factor)

    def _freeze(self, i: int, old: torch.Tensor | None) -> None:
        if old is not None:
            # Frozen parameters never move (torch skips parameters without a gradient).
            train = self.trainable[i]
            self.master[i].copy_(torch.where(train, self.master[i], old))
            self.exp_avg[i].mul_(train)
            self.exp_avg_sq[i].mul_(train)

    def _gather_params(self, u: FlatUnit, master: torch.Tensor, *, lazy: bool = False) -> None:
        """Cast the updated chunk and all-gather the chunks of this rank's parameter shard; ``lazy``
        leaves a sharded unit's gather in flight until its next use (see [Note: lazy parameter gather])."""
        u.settle_params()  # an earlier update still in flight lands first
        chunk = master.to(u.param_dtype)
        colls = self.runtime.steps[u.index].param_gather  # the schedule's: empty when o = p
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
        self._take_started()  # a skipped step's started reductions: finished and dropped
        for u in self.units:
            u.grad_shard.zero_()
            for s in u.slots:
                s.param.grad = None

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the optimizer state (master weights and moments per unit)."""
        g = self.param_groups[0]
        return {
            "step": self.step_count,
            "param_groups": [{k: v for k, v in g.items() if k != "params"}],
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "units": {
                u.name: {
                    "range": u.o_range,
                    "master": self.master[i].clone(),
                    "exp_avg": self.exp_avg[i].clone(),
                    "exp_avg_sq": self.exp_avg_sq[i].clone(),
                }
                for i, u in enumerate(self.units)
            },
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load a shard written by :meth:`state_dict` on the same rank, plan and model."""
        for i, u in enumerate(self.units):
            if u.name not in sd["units"]:
                raise ZerotopoError(f"optimizer state has no unit {u.name!r}; it was saved for another model")
            s = sd["units"][u.name]
            if tuple(s["range"]) != tuple(u.o_range):
                raise ZerotopoError(
                    f"optimizer state of unit {u.name!r} covers elements {tuple(s['range'])}, this rank "
                    f"holds {u.o_range}: load it on the rank and plan that saved it"
                )
            self.master[i].copy_(s["master"])
            self.exp_avg[i].copy_(s["exp_avg"])
            self.exp_avg_sq[i].copy_(s["exp_avg_sq"])
            self._gather_params(u, self.master[i])
        self.step_count = int(sd["step"])
        for k, v in sd["param_groups"][0].items():
            self.param_groups[0][k] = tuple(v) if k == "betas" else v
        if self.scaler is not None and sd.get("loss_scaler"):
            self.scaler.load_state_dict(sd["loss_scaler"])
        self.runtime.invalidate_secondaries()
