"""The per-micro-batch runtime: module hooks that gather, write secondaries, reduce and free.

[Note: one micro-batch] For each unit, in forward order (recorded on the first forward; every rank runs
the same model, so every rank issues the same collectives in the same order):

- pre-forward: wait for the unit's all-gather over ``params`` (int8 with qwZ; nothing when ``p == 1``),
  issue the all-gathers of the next ``plan.prefetch`` units, point the parameters at the full buffer;
  free the previous unit's full weights (deferred by one unit so that the *last* unit of the forward is
  never freed: it keeps its weights for the backward that follows at once).
- post-forward: write this rank's secondary partition (the asynchronous copy of the hpZ race) and hook
  the unit's outputs so the backward can gather before the unit's backward runs.
- pre-backward (output-gradient hook): all-gather from the ``secondary`` group (else ``params``) unless
  the unit is still full; prefetch the previous unit.
- post-accumulate-grad (all trainable parameters of the unit counted): flatten the gradients in the
  reduce dtype, reduce-scatter over ``grads`` in ``layout.reduce_scatter_order``, add into the fp32
  gradient shard, free the full gradient and weights.
- end of backward (queued callback): units that got no gradient reduce-scatter zeros in unit order, so
  collectives never mismatch across ranks; unconsumed prefetches are drained.

Which collective each of these is — op, group, codec, one hop or two — is not decided here: it is the
unit's entry of the schedule (:func:`zerotopo.placement.schedule.engine_unit_steps`, the function the cost
model's schedule comes from); :meth:`Runtime._issue_gather` and :meth:`Runtime.reduce_unit` execute
the entry.

[Note: last backward] In the backward that :meth:`ShardedModule.set_is_last_backward` marks (the last
micro-batch of a step), a unit's gradient shard is final as soon as its reduce-scatter was added in,
so the runtime starts that unit's cross-replica reduction (the schedule's ``replica`` entry) there and
then, beside the rest of the backward, instead of after it (Lins' overlap of the step-end reduction);
the optimizer's step takes the results (:meth:`Runtime.replica_grads`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.profiler import record_function
from torch.utils._pytree import tree_flatten

from zerotopo.comm import collectives as C
from zerotopo.comm import qcollectives as Q
from zerotopo.comm import quant
from zerotopo.comm.mesh import Mesh
from zerotopo.engine.streams import Ready, Sanitizer, Streams
from zerotopo.engine.units import FlatUnit, UnitComm, UnitState
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout
from zerotopo.placement.codecs import Codec, get_codec, plan_codecs
from zerotopo.placement.schedule import Collective, UnitSteps, engine_unit_steps


class UnitEntries(dict):
    """The units' schedule entries by unit index (:attr:`Runtime.steps`). Setting an entry binds it to
    its unit (``bind(index, steps)``: the unit's codecs and groups are chosen again from the new entry),
    so an edited schedule is what runs."""

    def __init__(self, bind: Any) -> None:
        super().__init__()
        self._bind = bind

    def __setitem__(self, index: int, steps: UnitSteps) -> None:
        super().__setitem__(index, steps)
        self._bind(index, steps)


class Runtime:
    """Hooks and collectives of the forward and backward passes for a list of units."""

    def __init__(
        self,
        units: list[FlatUnit],
        mesh: Mesh,
        *,
        reduce_dtype: torch.dtype,
        ledger: Any,
        streams: Streams,
        sanitizer: Sanitizer,
        unordered_secondary: bool = False,
    ) -> None:
        self.units = units
        self.mesh = mesh
        self.plan = mesh.plan
        self.degrees = mesh.degrees
        self.reduce_dtype = reduce_dtype
        self.ledger = ledger
        self.streams = streams
        self.sanitizer = sanitizer
        # The racy stock ordering is a test/benchmark hook of the engine, never a plan option.
        self.sync = "none" if unordered_secondary else self.plan.sync
        if self.sync == "none" and self.degrees.secondary is not None:
            warnings.warn(
                f"plan {self.plan.name!r} runs with unordered_secondary=True: the secondary partition copy "
                "and the backward all-gather are not ordered (stock ZeRO++ hpZ). Training can read "
                "uninitialized memory and diverge. This hook exists only to reproduce the race.",
                RuntimeWarning,
                stacklevel=3,
            )
        self.order: list[int] | None = None  # forward order of unit indices, from the first forward
        self._recording: list[int] = []
        self._last_forward: FlatUnit | None = None
        self._callback_queued = False
        self.in_backward = False
        self.rs_order = layout.reduce_scatter_order(self.degrees)
        self.os_order = layout.optim_scatter_order(self.degrees)
        # What runs for each unit, as data (see the module note), bound to the units once.
        self.steps = self._bind_units(units, reduce_dtype)
        self.last_backward = False
        """Whether the backward now running is the last before ``optimizer.step()`` (see the note)."""
        self._handles: list[Any] = []
        for u in units:
            self._install(u)

    def _bind_units(self, units: list[FlatUnit], reduce_dtype: torch.dtype) -> UnitEntries:
        """Each unit's schedule entry, bound to the unit with the codecs and groups that run it."""
        entries = UnitEntries(self._bind_unit)
        if not units:
            return entries
        widths = {
            "param_bytes": units[0].param_dtype.itemsize,
            "reduce_bytes": reduce_dtype.itemsize,
            "grad_shard_bytes": units[0].grad_dtype.itemsize,
        }
        self._codecs = plan_codecs(self.plan, **widths)
        all_steps = engine_unit_steps(
            [u.numel for u in units], self.mesh.topology, self.plan, degrees=self.degrees, **widths
        )
        for u, steps in zip(units, all_steps):
            entries[u.index] = steps
        return entries

    def _bind_unit(self, index: int, steps: UnitSteps) -> None:
        """Choose unit ``index``'s codecs (each collective's own; the plan's where the unit has none, as
        the forward gather of a ``p = 1`` unit) and groups for its entry ``steps``, once."""
        u = self.units[index]
        block = self.plan.quant_block

        def codec(colls: tuple[Collective, ...], default: Codec) -> Q.WireCodec:
            return Q.wire_codec(get_codec(colls[0].dtype) if colls else default, block)

        hops = steps.reduce if len(steps.reduce) == 2 else ()
        replica = tuple(
            C.reduction_step(
                c.op,
                self.mesh.group(c.group),
                order=self.os_order,
                ledger=self.ledger,
                tag=f"replicas {u.name}",
            )
            for c in steps.replica
        )
        u.bind(
            UnitComm(
                steps=steps,
                forward=codec(steps.forward, self._codecs.gather),
                backward=codec(steps.backward, self._codecs.gather),
                reduce=codec(steps.reduce, self._codecs.reduce),
                reduce_hops=tuple(self.mesh.group(c.group) for c in hops) or (None, None),
                replica=replica,
                secondary=Q.wire_codec(self._codecs.secondary, block)
                if self.degrees.secondary is not None
                else None,
            )
        )

    # -- hooks ----------------------------------------------------------------------------------------------
    def _install(self, u: FlatUnit) -> None:
        if u.module is not None:
            self._handles.append(u.module.register_forward_pre_hook(lambda m, a, u=u: self.pre_forward(u)))
            self._handles.append(
                u.module.register_forward_hook(lambda m, a, out, u=u: self.post_forward(u, out))
            )
        for s in u.slots:
            if s.trainable:
                self._handles.append(
                    s.param.register_post_accumulate_grad_hook(lambda p, u=u: self.post_accumulate(u))
                )

    def begin_forward(self) -> None:
        """Start of the wrapped model's forward (one micro-batch)."""
        self._recording = []
        self._last_forward = None
        self._callback_queued = False
        self.in_backward = False
        for u in self.units:
            u.grads_ready = 0
            u.reduced = False
            u.backward_started = False
            if u.module is None:
                # The root unit (stray parameters) is used anywhere in the forward: gather it first and
                # keep it until its gradients are reduced.
                self._ensure_full(u, backward=False)
                u.set_views()

    def end_forward(self, outputs: Any) -> Any:
        """End of the wrapped model's forward: the last unit keeps its weights; arm the backward."""
        if self.order is None:
            self.order = list(self._recording)
        tensors = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if tensors:
            register_multi_grad_hook(tensors, lambda grads: self._queue_final(), mode="any")
        else:
            # No backward follows (evaluation, no_grad): nothing may stay gathered, or the next training
            # forward would skip a gather and hold a full unit it never planned for.
            self._release_all()
        return outputs

    def _release_all(self) -> None:
        for u in self.units:
            if u.state is UnitState.GATHERING:
                self._wait_gather(u)
            if u.sharded and u.state is UnitState.FULL:
                u.free_full()

    def _queue_final(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            self.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self.end_backward)

    def pre_forward(self, u: FlatUnit) -> None:
        if self.in_backward:
            # Activation recomputation inside the backward: the weights are already gathered.
            self._ensure_full_with_borrows(u, backward=True)
            return
        prev = self._last_forward
        if prev is not None and prev is not u:
            keep = {u.index, *(b.index for b in u.borrows)}
            for x in (prev, *prev.borrows):
                if x.index not in keep and x.sharded and x.state is UnitState.FULL:
                    x.free_full()
        with record_function(f"zerotopo::forward_gather {u.name}"):
            self._ensure_full_with_borrows(u, backward=False)
            if self.order is not None:
                for nxt in self._next_in_order(u, self.plan.prefetch, reverse=False):
                    self._issue_gather_with_borrows(nxt, backward=False)
        if self.order is None:
            self._recording.append(u.index)

    def post_forward(self, u: FlatUnit, out: Any) -> Any:
        if self.in_backward:
            return out
        self._last_forward = u
        if u.comm.secondary is not None and torch.is_grad_enabled():
            with record_function(f"zerotopo::secondary_write {u.name}"):
                u.write_secondary(self.streams, host_wait=self.sync == "host")
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if tensors:
            register_multi_grad_hook(tensors, lambda grads, u=u: self.pre_backward(u), mode="any")
        return out

    def pre_backward(self, u: FlatUnit) -> None:
        self._queue_final()
        if u.backward_started:
            return
        u.backward_started = True
        with record_function(f"zerotopo::backward_gather {u.name}"):
            self._ensure_full_with_borrows(u, backward=True)
            for prv in self._next_in_order(u, self.plan.prefetch, reverse=True):
                self._issue_gather_with_borrows(prv, backward=True)

    def post_accumulate(self, u: FlatUnit) -> None:
        u.grads_ready += 1
        if u.grads_ready == u.trainable_count and not u.reduced:
            self.reduce_unit(u)

    def end_backward(self) -> None:
        """Reduce units without gradients (zeros, fixed unit order) and drain unconsumed gathers."""
        for u in self.units:
            if not u.reduced and u.trainable_count > 0:
                self.reduce_unit(u)
        self._release_all()
        self.in_backward = False
        self._callback_queued = False
        self.last_backward = False  # one backward only: the next step's micro-batches accumulate again

    # -- forward/backward gathers ----------------------------------------------------------------------------
    def _next_in_order(self, u: FlatUnit, depth: int, *, reverse: bool) -> list[FlatUnit]:
        if not self.order or depth == 0 or u.index not in self.order:
            return []
        seq = self.order[::-1] if reverse else self.order
        i = seq.index(u.index)
        return [self.units[j] for j in seq[i + 1 : i + 1 + depth]]

    def _ensure_full_with_borrows(self, u: FlatUnit, *, backward: bool) -> None:
        """Gather ``u`` and the units it borrows tied parameters from (see [Note: tied parameters] in
        ``units.py``), and point their parameters at the full buffers."""
        for b in u.borrows:
            self._issue_gather(b, backward=backward)
        self._ensure_full(u, backward=backward)
        for b in u.borrows:
            self._ensure_full(b, backward=backward)
            b.set_views()
        u.set_views()

    def _issue_gather_with_borrows(self, u: FlatUnit, *, backward: bool) -> None:
        """Prefetch ``u`` and the units it borrows from."""
        for b in u.borrows:
            self._issue_gather(b, backward=backward)
        self._issue_gather(u, backward=backward)

    def _release_borrows(self, u: FlatUnit) -> None:
        """After ``u``'s gradients are reduced its borrowed units may go, unless their own backward has
        started (it frees them itself) or a prefetch is filling them."""
        for b in u.borrows:
            if b.sharded and b.state is UnitState.FULL and not b.backward_started:
                b.free_full()

    def _ensure_full(self, u: FlatUnit, *, backward: bool) -> None:
        if u.state is UnitState.FULL:
            return
        if u.state is UnitState.SHARDED:
            self._issue_gather(u, backward=backward)
        self._wait_gather(u)

    def _issue_gather(self, u: FlatUnit, *, backward: bool) -> None:
        """Start the all-gather that fills ``u``'s full buffer (no-op when already full or issued)."""
        if u.state is not UnitState.SHARDED:
            return
        steps = u.comm.steps
        colls, codec = (steps.backward, u.comm.backward) if backward else (steps.forward, u.comm.forward)
        if backward and self.degrees.secondary is not None:
            if u.secondary is not None:
                # a whole-unit bf16 secondary (s = 1) has no collective: the copy is the full unit
                self._issue_secondary_gather(u, colls[0] if colls else None)
                return
            # no partition written (no forward with grad since the step): the primary
            colls, codec = steps.forward, u.comm.forward
        (c,) = colls  # a sharded unit gathers in one call
        u.alloc_full()
        group = self.mesh.group(c.group)
        tag = f"{'backward' if backward else 'forward'} {u.name}"
        stream = self.streams.all_gather
        if stream is not None:
            stream.wait_stream(self.streams.current())
        # the previous step's parameter update, left in flight until this first read of the shard
        u.settle_params(stream)
        with C.stream_context(stream):
            pending = codec.all_gather(
                u.full, u.param_shard, group, ledger=self.ledger, stream=stream, tag=tag
            )
        u.gather = (pending, None)
        u.state = UnitState.GATHERING

    def _issue_secondary_gather(self, u: FlatUnit, c: Collective | None) -> None:
        """Backward all-gather ``c`` over the secondary group from this rank's secondary partition (None:
        the partition is the whole unit, copied into the full buffer when waited)."""
        holder: Ready = u.secondary
        stream = self.streams.all_gather
        if self.sync != "none":
            # Rule 1: the gather's stream waits on the copy's ready-event (the host only on CPU, and only
            # here at the consumer, so the copy overlaps the forward compute).
            holder.wait(stream)
        if stream is not None:
            stream.wait_stream(self.streams.current())
        self.sanitizer.check(holder, unit=u.name, op="backward all-gather")
        if stream is not None:
            _record_stream(holder.tensor, stream)
        u.alloc_full()
        tag = f"backward {u.name}"
        if c is None:
            u.gather = (C.Pending(None, [], u.device, None, None), holder.tensor)
            u.state = UnitState.GATHERING
            return
        group = self.mesh.group(c.group)
        with C.stream_context(stream):
            pending, tmp = u.comm.secondary.gather_encoded(
                u.full, holder.tensor, group, ledger=self.ledger, stream=stream, tag=tag
            )
        u.gather = (pending, tmp)
        u.state = UnitState.GATHERING

    def _wait_gather(self, u: FlatUnit) -> None:
        pending, tmp = u.gather
        stream = self.streams.all_gather
        # Rule 2: the event covers the collective only once wait() was called on the recording stream.
        pending.wait(stream) if stream is not None else pending.wait()
        with C.stream_context(stream):
            if tmp is not None and tmp is not u.full:
                u.full.copy_(tmp)
        ev = self.streams.record(stream)
        Ready(u.full, ev, f"full weights of {u.name}").wait(self.streams.current())
        u.gather = None
        u.state = UnitState.FULL

    # -- gradients -------------------------------------------------------------------------------------------
    def reduce_unit(self, u: FlatUnit) -> None:
        """Reduce-scatter ``u``'s gradients into its fp32 shard (the unit's ``reduce`` entry: plain, int4
        in one all-to-all or in two hops); free the full gradient and weights."""
        d = self.degrees
        colls = u.comm.steps.reduce
        if u.replica_pending is not None:
            raise ZerotopoError(
                f"unit {u.name!r}: a backward ran after the one marked set_is_last_backward() and before "
                "optimizer.step(); its gradients would miss the step's reduction. Mark only the last "
                "micro-batch of a step, and call optimizer.step() after it"
            )
        rs = self.streams.reduce_scatter
        if rs is not None:
            # The gradients were produced on the compute stream; the reduction runs beside it.
            rs.wait_stream(self.streams.current())
        with record_function(f"zerotopo::reduce_scatter {u.name}"), C.stream_context(rs):
            flat = u.flat_grad(self.reduce_dtype, stream=rs)
            if not colls:  # g = 1: the shard is the whole gradient
                u.grad_shard.add_(flat)
            else:
                out = torch.empty(u.padded // d.grads, dtype=self.reduce_dtype, device=u.device)
                u.comm.reduce.reduce_scatter(
                    out, flat, self.mesh.group("grads"), order=self.rs_order, hops=u.comm.reduce_hops,
                    ledger=self.ledger, stream=rs, tag=f"grads {u.name}",
                )  # fmt: skip
                u.grad_shard.add_(out)
        u.reduced = True
        if u.sharded:
            if u.state is UnitState.GATHERING:
                self._wait_gather(u)
            u.free_full()
        self._release_borrows(u)
        if self.last_backward:
            self._start_replica_reduce(u)

    # -- the cross-replica reduction -------------------------------------------------------------------------
    def replica_reduce(self, u: FlatUnit) -> torch.Tensor:
        """Run ``u``'s ``replica`` entry of the schedule on its gradient shard, in order (all-reduce: the
        papers' select-and-drop; or reduce-scatter into the optimizer chunk, then all-reduce over its
        replicas): this rank's optimizer chunk of the gradient summed over the whole world, in the
        gradient shard's dtype (fp32, or the parameter dtype under ``grad_dtype: param``).

        A chunk that is the gradient shard or a slice of it is returned as is, not copied (the step
        scales and clips an fp32 one in place, as ``clip_grad_norm_`` does ``.grad``; ``zero_grad``
        clears it), so the step holds no second copy of the gradients; the cost model counts a copy only
        where one is made (``zerotopo.cost.memory``: the reduce-scatter's chunks in ``buffers``, the
        fp32 upcast in ``step_buffers``)."""
        buf = u.grad_shard
        for link in u.comm.replica:
            buf = link(buf)
        if buf is u.grad_shard:
            lo, hi = u.optim_in_grad
            return buf[lo:hi]
        return buf

    def _start_replica_reduce(self, u: FlatUnit) -> None:
        """``u``'s gradient shard is final in the last backward: reduce it across replicas now, beside
        the rest of the backward (device: the replica stream; CPU: the engine's worker thread)."""
        streams = self.streams
        u.replica_pending = streams.run_async(
            f"step-end reduction of {u.name}", lambda: self.replica_reduce(u), after=streams.reduce_scatter
        )

    def take_started_reductions(self) -> dict[int, torch.Tensor]:
        """Wait for every reduction the last backward started and take them off their units (by unit
        position): the step's own collectives never interleave with them."""
        streams = self.streams
        done = {}
        for i, u in enumerate(self.units):
            holder, u.replica_pending = u.replica_pending, None
            if holder is not None:
                g = holder.wait(streams.current())
                if streams.on_device:
                    g.record_stream(streams.current())  # made on the replica stream, used and freed here
                done[i] = g
        return done

    def replica_grads(self) -> list[torch.Tensor]:
        """Every unit's optimizer chunk of the world's gradient, in fp32: the reductions the last backward
        started, then the rest."""
        self.wait_reductions()
        done = self.take_started_reductions()
        # upcast here, not in the backward: an fp32 copy of a 2-byte chunk would outlive the activations
        return [
            (done[i] if i in done else self.replica_reduce(u)).to(torch.float32)
            for i, u in enumerate(self.units)
        ]

    def wait_reductions(self) -> None:
        """Order the optimizer step after every gradient reduction (device: the reduce-scatter stream)."""
        rs = self.streams.reduce_scatter
        if rs is not None:
            self.streams.current().wait_stream(rs)

    def invalidate_secondaries(self) -> None:
        """After the optimizer step every secondary partition holds stale weights."""
        for u in self.units:
            u.secondary = None

    def remove(self) -> None:
        for u in self.units:
            u.settle_params()  # no collective left in flight when the model goes
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _record_stream(x: Any, stream: Any) -> None:
    """Tell the allocator that ``stream`` uses ``x`` (a tensor or a quantized pair), so it is not reused
    before that stream's work finished (rule 1: buffers are freed only after their consumer)."""
    for t in (x.data, x.scales) if isinstance(x, quant.Quantized) else (x,):
        t.record_stream(stream)
