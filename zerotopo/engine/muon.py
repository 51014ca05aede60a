"""Muon on the sharded optimizer: torch's ``Muon`` update on the 2-D weight matrices of the layers,
each matrix's state held whole by one owner inside the ``optim`` group, and an elementwise aux optimizer
(AdamW by default) on everything else (see [Note: the Muon split] in :mod:`zerotopo.config.muon`).

[Note: Muon with owner-held state] Each matrix has one owner in the ``optim`` group
(:func:`zerotopo.placement.matrices.assign_owners`: Newton-Schulz FLOPs balanced, then bytes), which
holds its fp32 master and its ``momentum_buffer`` whole (``owned_master[k]``, ``owned_momentum[k]``,
shape ``(rows, cols)``) and runs torch's own ``Muon`` step on them. A step, after the gradient
reduction and clipping:

1. every position sends its fp32 gradient pieces of each matrix to the owner (one all-to-all over the
   ``optim`` group, each pair exactly its pieces: :func:`zerotopo.comm.collectives.all_to_all_uneven`);
2. the owner runs ``torch.optim.Muon`` on the whole matrices it owns (momentum, Newton-Schulz in bf16,
   weight decay, update of the whole fp32 master): the same operations on the same inputs as the
   single-process reference;
3. the owner sends the updated fp32 weights back to the positions that hold the matrix's elements (the
   reverse all-to-all), which write them into their master chunk ``master[i]``: the chunks keep a copy
   of the matrices' fp32 master, refreshed every step; the owner's is the one the update runs on.

fp32 both ways is the cheapest choice that keeps the rest unchanged: the momentum update needs the fp32
gradient (the Newton-Schulz input is computed from it on the owner), and the chunk ``master[i]`` is what
the parameter all-gather casts and sends, what exports read and what checkpoints store as the weights,
so receiving the exact fp32 values leaves the all-gather, exports and the checkpoint's weights as they
are (returning bf16 would halve that direction but leave ``master[i]`` rounded, and every reader of it
would have to ask the owners instead). The per-rank traffic is
:meth:`~zerotopo.placement.matrices.Exchange.step_bytes`: 4 bytes per matrix element a position sends to
other owners, plus 4 per element of its own matrices the others hold.

Memory, per rank: the element chunks keep ``master[i]`` and every state buffer over the whole chunk, as
for an elementwise type (``4 × (1 + states)`` bytes per chunk element, 16 with an AdamW aux), and the
owner adds 8 bytes per element it owns (master and momentum); :meth:`MuonOnShards.state_bytes` and the
start line report both and the owners' imbalance. Over the element layout (16 bytes per parameter) this
adds the owned 8: the chunks' regions over the matrices of the aux states, of ``momentum_buffer`` and
of the master copy are what a compact chunk layout would drop (every reader of the chunks, checkpoints
and exports included, would then read the matrices from their owners). The chunk's ``momentum_buffer`` over a matrix is the
checkpoint's per-parameter layout, not the running state: :meth:`MuonOnShards.sync_shards` (collective)
copies the owners' momentum into it before a save, and loading (``load_state_dict``, which the
checkpoint load and a Hugging Face or NeoX import end with) hands the chunks' master and momentum to
the owners. So checkpoints, resharding to another world size or ``optim`` degree, ``ckpt verify`` and
export store and read every state per parameter, whatever the assignment.

A fused matrix (NeoX's ``query_key_value``, a gated MLP's fused up projection) is orthogonalized as
stored, one matrix, as torch's ``Muon`` does for the same module.

Which parameters are matrices: the trainable 2-D parameters of every unit but the first and the last of
the model's units (the embedding and the head in zerotopo's models) and the root unit of stray
parameters. fp16 loss scaling is refused (train in bf16 or fp32).
"""

from __future__ import annotations

from typing import Any

import torch

from zerotopo.comm import collectives as C
from zerotopo.config.muon import run_spec, split_hyperparameters
from zerotopo.engine.optim import LossScaler, ShardedOptimizer, make_scaler, shard_state
from zerotopo.engine.optim_torch import resolve_optimizer
from zerotopo.engine.units import FlatUnit, ParamSlot, default_no_decay
from zerotopo.errors import ZerotopoError
from zerotopo.placement import layout
from zerotopo.placement.matrices import Matrix, assign_owners, exchange


def matrix_slots(units: list[FlatUnit]) -> list[tuple[int, ParamSlot]]:
    """``(unit index, slot)`` of every parameter Muon updates: trainable, 2-D, in a unit that is neither
    the first nor the last of the model's units (nor the root unit of stray parameters)."""
    inner = [i for i, u in enumerate(units) if u.name != "<root>"][1:-1]
    return [(i, s) for i in inner for s in units[i].slots if s.trainable and len(s.shape) == 2]


class MuonOnShards(ShardedOptimizer):
    """Muon on the matrices, the aux optimizer on the rest, over every unit's optimizer shard.

    ``param_groups[0]`` holds Muon's ``lr``, ``weight_decay`` and hyperparameters, and ``aux``: the aux
    type and its hyperparameters (its ``lr`` is scaled by ``lr`` over the peak ``lr`` given here, so a
    schedule that sets ``param_groups[0]["lr"]`` moves both). ``states`` holds the aux type's states and
    ``momentum_buffer``, each a flat buffer per unit laid out as ``master``; ``owners`` and ``ownership``
    say which position of the ``optim`` group owns each matrix, ``owned_master`` and ``owned_momentum``
    (matrix index to ``(rows, cols)`` fp32 tensor) the state of the matrices this rank owns (see
    [Note: Muon with owner-held state]). :meth:`state_dict` and :meth:`load_state_dict` are collective
    over the ``optim`` group (the owners' state moves to and from the chunks)."""

    def __init__(
        self,
        model: Any,
        optimizer_class: Any = "Muon",
        *,
        lr: float = 0.02,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = None,
        no_decay: Any = default_no_decay,
        loss_scale: LossScaler | str | float | None = "dynamic",
        **hyperparameters: Any,
    ) -> None:
        state = shard_state(model)
        scaler = (
            loss_scale if isinstance(loss_scale, LossScaler) else make_scaler(loss_scale, state.param_dtype)
        )
        if scaler is not None:
            raise ZerotopoError(
                "optimizer Muon: fp16 loss scaling is not supported with Muon; train in bf16 or fp32 "
                "(precision: bf16)"
            )
        _, hyper = resolve_optimizer("Muon", hyperparameters)
        muon, aux_type, aux_hyper, aux_lr, aux_wd = split_hyperparameters(
            hyper, lr=lr, weight_decay=weight_decay
        )
        self.matrices = matrix_slots(state.units)
        self._is_matrix = {id(s) for _, s in self.matrices}
        super().__init__(
            model, aux_type, lr=aux_lr, weight_decay=aux_wd, max_grad_norm=max_grad_norm, no_decay=no_decay,
            loss_scale=None, **aux_hyper,
        )  # fmt: skip
        self.aux_spec = self.spec
        self.spec = run_spec(self.aux_spec)
        self._peak_lr = float(lr)
        # One group, the master shards, as torch's contract wants: Muon's hyperparameters at its top
        # level (what a scheduler moves), the aux optimizer's under "aux".
        group = self.param_groups[0]
        aux = {k: v for k, v in group.items() if k != "params"}
        params = group["params"]
        group.clear()
        group.update({"lr": lr, "weight_decay": weight_decay, **muon, "aux": {"type": aux_type, **aux}})
        group["params"] = params
        self.defaults = {k: v for k, v in group.items() if k != "params"}
        self.states.setdefault("momentum_buffer", [torch.zeros_like(m) for m in self.master])
        self._plan_exchange()
        self.shards_written()

    # -- the split ----------------------------------------------------------------------------------------
    def _elementwise(self, slot: Any) -> bool:
        return id(slot) not in self._is_matrix

    def _hyper(self) -> dict[str, Any]:
        """The aux optimizer's hyperparameters, its ``lr`` following the schedule."""
        g = self.param_groups[0]
        if "aux" not in g:  # inside the base constructor: the aux group is still param_groups[0]
            return super()._hyper()
        aux = {k: v for k, v in g["aux"].items() if k not in ("type", "weight_decay")}
        aux["lr"] = aux["lr"] * float(g["lr"]) / self._peak_lr
        return aux

    def _apply(self, i: int, grad: torch.Tensor, found_inf: torch.Tensor | None = None) -> None:
        """The aux optimizer's step of unit ``i`` (the matrices were updated by :meth:`_before_apply`),
        with the aux weight decay."""
        g = self.param_groups[0]
        muon_wd, g["weight_decay"] = g["weight_decay"], g["aux"]["weight_decay"]
        try:
            super()._apply(i, grad, found_inf)
        finally:
            g["weight_decay"] = muon_wd

    def describe(self) -> str:
        """The split and the owners, one line each (printed at start)."""
        g = self.param_groups[0]
        aux = g["aux"]
        n_mat = sum(s.numel for _, s in self.matrices)
        n_all = sum(s.numel for u in self.units for s in u.slots if s.trainable)
        own = self.ownership
        mem = self.state_bytes()
        return (
            f"optimizer Muon (lr {g['lr']:g}, weight decay {g['weight_decay']:g}, momentum {g['momentum']:g}, "
            f"{g['ns_steps']} Newton-Schulz steps, adjust_lr_fn {g['adjust_lr_fn'] or 'original'}) on "
            f"{len(self.matrices)} matrices ({n_mat / 1e6:.3f}M of {n_all / 1e6:.3f}M parameters: "
            f"{', '.join(s.name for _, s in self.matrices[:3])}{', ...' if len(self.matrices) > 3 else ''}); "
            f"{aux['type']} (lr {aux['lr']:g}, weight decay {aux['weight_decay']:g}) on the other "
            f"{(n_all - n_mat) / 1e6:.3f}M (embedding, head, norms, biases); matrix owners over "
            f"{len(own.flops)} optimizer positions, imbalance (max/mean) FLOPs {own.flops_imbalance:.2f}, "
            f"bytes {own.bytes_imbalance:.2f}; optimizer state on this rank {mem['per_param']:.2f} bytes per "
            f"parameter ({mem['shards'] / 2**20:.2f} MiB on the element shards, {mem['owned'] / 2**20:.2f} MiB "
            f"owned); exchange {self.exchange.step_bytes(self._me) / 2**20:.2f} MiB per step from this rank"
        )

    def state_bytes(self) -> dict[str, float]:
        """This rank's optimizer-state bytes: ``shards`` (the element chunks: master and every state
        buffer), ``owned`` (the owned matrices' fp32 master and momentum), and ``per_param``: their sum
        per model parameter over the ``optim`` group's size (the bytes per parameter this rank holds,
        to compare with an elementwise type's ``bytes_per_element``)."""
        shards = sum(t.numel() * t.element_size() for t in (*self.master, *self._state_tensors()))
        owned = self.owned_bytes
        n_all = sum(u.numel for u in self.units)
        per_param = (shards + owned) * self.degrees.optim / n_all if n_all else 0.0
        return {"shards": shards, "owned": owned, "per_param": per_param}

    def _state_tensors(self) -> list[torch.Tensor]:
        return [t for bufs in self.states.values() for t in bufs]

    @property
    def owned_bytes(self) -> int:
        """Bytes of the owned matrices' state on this rank (fp32 master and momentum)."""
        tensors = (*self.owned_master.values(), *self.owned_momentum.values())
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- the owners and the exchange -----------------------------------------------------------------
    def _plan_exchange(self) -> None:
        """Owners, the pieces each position sends, this rank's send and receive lists, and the torch
        ``Muon`` over the whole matrices this rank owns."""
        d = self.degrees
        members = layout.group_of(self.mesh.topo_index, d, "optim")
        me = members.index(self.mesh.topo_index)
        self.group = self.mesh.group("optim") if d.optim > 1 else None
        if self.group is not None and self.group.position != me:
            raise ZerotopoError(
                f"optim group position {self.group.position} is not topological position {me}: the mesh "
                "and the layout disagree"
            )
        self._me = me
        mats = [Matrix(s.name, i, s.offset, *s.shape) for i, s in self.matrices]
        self.ownership = assign_owners(mats, d.optim, steps=int(self.param_groups[0]["ns_steps"]))
        self.owners = self.ownership.owners
        ranges = [[layout.optim_range(t, d, u.padded) for u in self.units] for t in members]
        self.exchange = ex = exchange(mats, self.owners, ranges)
        # what this rank holds of each owner's matrices, in send order:
        # (unit, offset in its chunk, count, offset in the send buffer)
        self._send_counts = ex.counts(me)
        self._send: list[tuple[int, int, int, int]] = []
        off = 0
        for pieces in ex.pieces[me]:
            for p in pieces:
                m = mats[p.matrix]
                self._send.append((m.unit, m.offset + p.lo - ranges[me][m.unit][0], p.numel, off))
                off += p.numel
        # what this rank receives as an owner: per owned matrix, (lo, hi, offset in the receive buffer)
        self._recv_counts = tuple(ex.counts(src)[me] for src in range(d.optim))
        self._recv: dict[int, list[tuple[int, int, int]]] = {}
        off = 0
        for src in range(d.optim):
            for p in ex.pieces[src][me]:
                self._recv.setdefault(p.matrix, []).append((p.lo, p.hi, off))
                off += p.numel
        owned = [k for k, q in enumerate(self.owners) if q == me]
        dev = self.mesh.device
        self.owned_master = {k: torch.zeros(mats[k].rows, mats[k].cols, device=dev) for k in owned}
        self.owned_momentum = {k: torch.zeros_like(self.owned_master[k]) for k in owned}
        groups = []
        for decay in (True, False):
            params = [self.owned_master[k] for k in owned if self.matrices[k][1].decay is decay]
            if params:
                groups.append({"params": params, "decay": decay})
        self._muon = torch.optim.Muon(groups) if groups else None
        if self._muon is not None:
            for k in owned:
                self._muon.state[self.owned_master[k]] = {"momentum_buffer": self.owned_momentum[k]}

    def _to_owners(self, chunks: list[torch.Tensor], tag: str) -> torch.Tensor:
        """This rank's pieces of every matrix out of the flat ``chunks`` (fp32), to their owners: the
        receive buffer of the matrices this rank owns (:attr:`_recv` says where each piece lies)."""
        send = torch.empty(sum(self._send_counts), dtype=torch.float32, device=self.mesh.device)
        for i, a, n, off in self._send:
            send[off : off + n].copy_(chunks[i][a : a + n])
        if self.group is None:
            return send
        recv = torch.empty(sum(self._recv_counts), dtype=torch.float32, device=self.mesh.device)
        C.all_to_all_uneven(
            recv, send, self._recv_counts, self._send_counts, self.group, ledger=self.ledger, tag=tag
        )
        return recv

    def _from_owners(self, owned: dict[int, torch.Tensor], chunks: list[torch.Tensor], tag: str) -> None:
        """The owned whole matrices ``owned`` (fp32) back to the positions that hold their elements,
        written into the flat ``chunks``."""
        back = torch.empty(sum(self._recv_counts), dtype=torch.float32, device=self.mesh.device)
        for k, spans in self._recv.items():
            flat = owned[k].reshape(-1)
            for lo, hi, off in spans:
                back[off : off + hi - lo].copy_(flat[lo:hi])
        if self.group is None:
            ret = back
        else:
            ret = torch.empty(sum(self._send_counts), dtype=torch.float32, device=self.mesh.device)
            C.all_to_all_uneven(
                ret, back, self._send_counts, self._recv_counts, self.group, ledger=self.ledger, tag=tag
            )
        for i, a, n, off in self._send:
            chunks[i][a : a + n].copy_(ret[off : off + n])

    def _assemble(self, recv: torch.Tensor, into: dict[int, torch.Tensor]) -> None:
        """Write each owned matrix's pieces out of ``recv`` into its whole tensor in ``into``."""
        for k, spans in self._recv.items():
            flat = into[k].view(-1)
            for lo, hi, off in spans:
                flat[lo:hi].copy_(recv[off : off + hi - lo])

    @torch.no_grad()
    def shards_written(self) -> None:
        """Collective over the ``optim`` group: take the chunks' ``master`` and ``momentum_buffer`` over
        each matrix as the owners' state (after the chunks were written from outside: construction, a
        checkpoint, a Hugging Face or NeoX import, a full state dict)."""
        self._assemble(self._to_owners(self.master, "muon master to owners"), self.owned_master)
        bufs = self.states["momentum_buffer"]
        self._assemble(self._to_owners(bufs, "muon momentum to owners"), self.owned_momentum)

    @torch.no_grad()
    def sync_shards(self) -> None:
        """Collective over the ``optim`` group: copy the owners' momentum into the chunks'
        ``momentum_buffer`` (and their master into ``master``, which already holds it), so the chunks
        hold the whole state per parameter, as a checkpoint stores it."""
        self._from_owners(self.owned_master, self.master, "muon master to shards")
        self._from_owners(self.owned_momentum, self.states["momentum_buffer"], "muon momentum to shards")

    def state_dict(self) -> dict[str, Any]:
        """Collective over the ``optim`` group (:meth:`sync_shards`), then the elementwise layout: the
        momentum of the matrices is stored per element like every state."""
        self.sync_shards()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Collective over the ``optim`` group: the chunks as for an elementwise type, then handed to the
        owners (:meth:`shards_written`)."""
        super().load_state_dict(state_dict)
        self.shards_written()

    @torch.no_grad()
    def _before_apply(self, grads: list[torch.Tensor]) -> None:
        """Muon's step of every matrix (see [Note: Muon with owner-held state])."""
        if not self.matrices:
            return
        recv = self._to_owners(grads, "muon grads to owners")
        if self._muon is not None:
            g = self.param_groups[0]
            whole = {k: torch.empty_like(t) for k, t in self.owned_master.items()}
            self._assemble(recv, whole)
            for k, t in self.owned_master.items():
                t.grad = whole[k]
            for group in self._muon.param_groups:
                for key in ("momentum", "nesterov", "eps", "ns_steps", "adjust_lr_fn"):
                    group[key] = g[key]
                group["lr"] = float(g["lr"])  # a scheduler may hold it as a 0-d tensor
                group["ns_coefficients"] = tuple(g["ns_coefficients"])
                group["weight_decay"] = g["weight_decay"] if group["decay"] else 0.0
            self._muon.step()
            for t in self.owned_master.values():
                t.grad = None
        self._from_owners(self.owned_master, self.master, "muon weights to shards")
