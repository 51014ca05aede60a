"""Muon on the sharded optimizer: torch's ``Muon`` update on the 2-D weight matrices of the layers,
with whole-matrix Newton-Schulz owners inside the ``optim`` group, and an elementwise aux optimizer
(AdamW by default) on everything else (see [Note: the Muon split] in :mod:`zerotopo.config.muon`).

[Note: Muon on element shards] torch's ``Muon`` step of a matrix ``W`` with gradient ``G`` is::

    B ← B.lerp(G, 1 - μ)                      (momentum, elementwise)
    U ← G.lerp(B, μ) if nesterov else B       (elementwise)
    O ← NS(bf16(U))                           (Newton-Schulz: needs the whole matrix)
    W ← W·(1 - lr·λ);  W ← W - lr·adjust(shape)·O   (elementwise)

Only ``NS`` needs the whole matrix, and its input is cast to bf16 before anything else. So the fp32
master ``W`` and the momentum ``B`` stay on the element shards (``master[i]`` and
``states["momentum_buffer"][i]``, laid out as every state is, so checkpoints, resharding and export
treat them like any optimizer's: stored per parameter); each position computes ``U`` on its pieces,
sends them in bf16 to the matrix's owner (one all-to-all over the ``optim`` group), the owner runs
torch's own Newton-Schulz on the whole matrix, and sends ``O`` (bf16) back (a second all-to-all); each
position applies the elementwise update to its pieces. Owners are assigned by
:func:`zerotopo.placement.matrices.assign_owners` (balanced Newton-Schulz FLOPs). Every value is computed
by the same operations on the same inputs as torch's single-process ``Muon``. The parameter all-gather
after the step is unchanged; the two all-to-alls are the extra traffic, ``(o - 1) × width`` bf16
elements each way per rank (:class:`~zerotopo.placement.matrices.Exchange`).

A fused matrix (NeoX's ``query_key_value``, a gated MLP's fused up projection) is orthogonalized as
stored, one matrix, as torch's ``Muon`` does for the same module.

Which parameters are matrices: the trainable 2-D parameters of every unit but the first and the last of
the model's units (the embedding and the head in zerotopo's models) and the root unit of stray
parameters. fp16 loss scaling is refused (train in bf16 or fp32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

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
    say which position of the ``optim`` group orthogonalizes each matrix."""

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
        return (
            f"optimizer Muon (lr {g['lr']:g}, weight decay {g['weight_decay']:g}, momentum {g['momentum']:g}, "
            f"{g['ns_steps']} Newton-Schulz steps, adjust_lr_fn {g['adjust_lr_fn'] or 'original'}) on "
            f"{len(self.matrices)} matrices ({n_mat / 1e6:.3f}M of {n_all / 1e6:.3f}M parameters: "
            f"{', '.join(s.name for _, s in self.matrices[:3])}{', ...' if len(self.matrices) > 3 else ''}); "
            f"{aux['type']} (lr {aux['lr']:g}, weight decay {aux['weight_decay']:g}) on the other "
            f"{(n_all - n_mat) / 1e6:.3f}M (embedding, head, norms, biases); Newton-Schulz owners over "
            f"{len(own.flops)} optimizer positions, FLOPs imbalance {own.flops_imbalance:.2f}, "
            f"exchange {self.exchange.width} elements per pair"
        )

    # -- the whole-matrix exchange ------------------------------------------------------------------------
    def _plan_exchange(self) -> None:
        """Owners, the pieces each position sends, and this rank's send and receive lists."""
        d = self.degrees
        members = layout.group_of(self.mesh.topo_index, d, "optim")
        me = members.index(self.mesh.topo_index)
        self.group = self.mesh.group("optim") if d.optim > 1 else None
        if self.group is not None and self.group.position != me:
            raise ZerotopoError(
                f"optim group position {self.group.position} is not topological position {me}: the mesh "
                "and the layout disagree"
            )
        mats = [Matrix(s.name, i, s.offset, *s.shape) for i, s in self.matrices]
        self.ownership = assign_owners(mats, d.optim, steps=int(self.param_groups[0]["ns_steps"]))
        self.owners = self.ownership.owners
        ranges = [[layout.optim_range(t, d, u.padded) for u in self.units] for t in members]
        self.exchange = ex = exchange(mats, self.owners, ranges)
        w = ex.width
        # what this rank sends: (unit, offset in its chunk, count, offset in the send buffer, matrix)
        self._send: list[tuple[int, int, int, int, int]] = []
        for dst, pieces in enumerate(ex.pieces[me]):
            off = dst * w
            for p in pieces:
                m = mats[p.matrix]
                self._send.append((m.unit, m.offset + p.lo - ranges[me][m.unit][0], p.numel, off, p.matrix))
                off += p.numel
        # what this rank receives as an owner: per owned matrix, (lo, hi, offset in the receive buffer)
        self._recv: dict[int, list[tuple[int, int, int]]] = {}
        for src in range(d.optim):
            off = src * w
            for p in ex.pieces[src][me]:
                self._recv.setdefault(p.matrix, []).append((p.lo, p.hi, off))
                off += p.numel
        self._shapes = [(m.rows, m.cols) for m in mats]
        self._decay = [s.decay for _, s in self.matrices]

    def _swap(self, send: torch.Tensor, tag: str) -> torch.Tensor:
        if self.group is None:
            return send
        recv = torch.empty_like(send)
        C.all_to_all(recv, send, self.group, ledger=self.ledger, tag=tag)
        return recv

    @torch.no_grad()
    def _before_apply(self, grads: list[torch.Tensor]) -> None:
        """Muon's step of every matrix (see [Note: Muon on element shards])."""
        if not self.matrices:
            return
        g = self.param_groups[0]
        mom, nesterov = float(g["momentum"]), bool(g["nesterov"])
        bufs = self.states["momentum_buffer"]
        send = torch.zeros(
            self.degrees.optim * self.exchange.width, dtype=torch.bfloat16, device=self.mesh.device
        )
        for i, a, n, off, _ in self._send:
            grad, buf = grads[i][a : a + n], bufs[i][a : a + n]
            buf.lerp_(grad, 1 - mom)
            send[off : off + n].copy_(grad.lerp(buf, mom) if nesterov else buf)
        recv = self._swap(send, "muon updates")
        back = torch.zeros_like(recv)
        coeffs, steps, eps = tuple(g["ns_coefficients"]), int(g["ns_steps"]), float(g["eps"])
        for k, spans in self._recv.items():
            rows, cols = self._shapes[k]
            whole = torch.empty(rows * cols, dtype=torch.bfloat16, device=self.mesh.device)
            for lo, hi, off in spans:
                whole[lo:hi] = recv[off : off + hi - lo]
            ortho = _zeropower_via_newtonschulz(whole.view(rows, cols), coeffs, steps, eps).reshape(-1)
            for lo, hi, off in spans:
                back[off : off + hi - lo] = ortho[lo:hi]
        ortho_pieces = self._swap(back, "muon orthogonalized")
        lr = float(g["lr"])
        for i, a, n, off, k in self._send:
            w = self.master[i][a : a + n]
            w.mul_(1 - lr * (float(g["weight_decay"]) if self._decay[k] else 0.0))
            w.add_(ortho_pieces[off : off + n], alpha=-_adjust_lr(lr, g["adjust_lr_fn"], self._shapes[k]))
