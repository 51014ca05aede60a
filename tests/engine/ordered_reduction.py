"""A single-process reference whose gradient sums follow a plan's reduction order, element by element.

[Note: the reference sums in the plan's order] fp32 addition is not associative: the engine sums the
ranks' gradients along its collectives (a ring reduce-scatter over the ``grads`` group per micro-batch,
accumulated over micro-batches, then the cross-replica reduction), a single-process reference along the
loop over ranks and micro-batches. The two sums differ in the last bits, and torch's Muon, which
orthogonalizes in bf16, turns a last-bit difference into a ~1e-3 one wherever it crosses a bf16 rounding
boundary (``test_single_process_muon_amplifies_gradient_rounding``). So the parity reference computes
every (rank, micro-batch) gradient on its own and adds them in the order the plan's collectives do; the
optimizer is then compared exactly, and that the two orders agree to fp32 rounding is checked on its
own (``test_plan_order_sum_equals_the_loop_sum_to_fp32_rounding``). The reference also runs with the
ranks' torch threads (``spawn``'s ``threads_per_rank``, 1): CPU kernels split some reductions by thread
count (LayerNorm's weight and bias gradients differ in the last bit between 1 and 2 threads).

The order replayed here is the one of ``zerotopo.comm.collectives``' ring reduce-scatter on gloo (block
``j`` starts on the group's next rank ``j + 1`` and ends, summed, on rank ``j``) with the layout's chunk
ranges (``zerotopo.placement.layout``), and a two-rank all-reduce (one addition, the same in either
order). An all-reduce over more than two ranks sums in gloo's own order, which is not replayed: such a
plan is refused by name. Ranks are their topological indices (no permuted launcher order).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zerotopo.engine.units import assign_params, collect_units
from zerotopo.placement import layout
from zerotopo.placement.plan import Degrees


def ring_sum(values: list[torch.Tensor], receiver: int) -> torch.Tensor:
    """The ring reduce-scatter's sum of one block over a group (``values`` in the group's rank order),
    as it lands on position ``receiver``: started by ``receiver + 1``, each next rank adds its own."""
    d = len(values)
    acc = values[(receiver + 1) % d].clone()
    for k in range(2, d + 1):
        acc += values[(receiver + k) % d]
    return acc


def _pair_sum(values: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(values) > 2:
        raise NotImplementedError(
            f"{what}: an all-reduce over {len(values)} ranks sums in gloo's own order, which the reference "
            "does not replay; use at most two replicas"
        )
    return values[0] + values[1] if len(values) == 2 else values[0].clone()


def reduce_like_plan(grads: list[list[torch.Tensor]], d: Degrees, grad_reduce: str) -> torch.Tensor:
    """The world's sum of one unit's flat (padded) gradients ``grads[rank][micro]``, added in the order the
    plan's collectives add them; every element as the optimizer chunk that holds it receives it."""
    numel = grads[0][0].numel()
    g_lo = {t: layout.grad_range(t, d, numel)[0] for t in range(d.world)}
    shards = {t: torch.zeros(numel // d.grads, dtype=grads[0][0].dtype) for t in range(d.world)}
    for m in range(len(grads[0])):
        for group in layout.groups(d, "grads"):
            for j, t in enumerate(group):
                lo, hi = layout.grad_range(t, d, numel)
                if len(group) == 1:
                    shards[t].add_(grads[t][m][lo:hi])
                else:
                    shards[t].add_(ring_sum([grads[r][m][lo:hi] for r in group], j))
    chunks: dict[int, torch.Tensor] = {}
    if grad_reduce == "allreduce":
        for group in layout.groups(d, "grad_replicas"):
            total = _pair_sum([shards[t] for t in group], "grad_replicas")
            for t in group:
                lo, hi = (x - g_lo[t] for x in layout.optim_range(t, d, numel))
                chunks[t] = total[lo:hi]
    else:
        for group in layout.groups(d, "optim_scatter"):
            for j, t in enumerate(group):
                lo, hi = (x - g_lo[t] for x in layout.optim_range(t, d, numel))
                parts = [shards[r][lo:hi] for r in group]
                chunks[t] = ring_sum(parts, j) if len(group) > 1 else parts[0]
        for group in layout.groups(d, "optim_replicas"):
            total = _pair_sum([chunks[t] for t in group], "optim_replicas")
            for t in group:
                chunks[t] = total
    out = torch.empty(numel, dtype=grads[0][0].dtype)
    for t, chunk in chunks.items():
        lo, hi = layout.optim_range(t, d, numel)
        out[lo:hi] = chunk
    return out


def unit_slots(model: nn.Module) -> list[list[tuple[str, nn.Parameter]]]:
    """Each unit's parameters in flat-buffer order, as ``parallelize`` lays them out by default."""
    pairs, stray = assign_params(model, collect_units(model, None))
    units = [params for _, _, params in pairs]
    return [*units, stray] if stray else units


def flat_grads(slots: list[tuple[str, nn.Parameter]], padded: int) -> torch.Tensor:
    """The unit's ``.grad`` as one flat fp32 buffer (zeros for padding and parameters without one)."""
    flat = torch.zeros(padded, dtype=torch.float32)
    offset = 0
    for _, p in slots:
        if p.grad is not None:
            flat[offset : offset + p.numel()] = p.grad.reshape(-1)
        offset += p.numel()
    return flat


def ordered_reference(
    model: nn.Module,
    optimizer: Any,
    d: Degrees,
    grad_reduce: str,
    *,
    steps: int,
    micro: int,
    batch: Any,
    loss_fn: Any,
    max_grad_norm: float | None,
    threads: int = 1,
) -> tuple[list, dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Train ``model`` with ``optimizer`` (one ``step``/``zero_grad``) on every rank's data, each step's
    gradient summed in the plan's order (:func:`reduce_like_plan`) and divided by the world size, then
    clipped as ``clip_grad_norm_`` does: losses[step][rank][micro], the final parameters, and per step the
    gradients the optimizer got together with the plain loop's sum (``{"ordered", "loop"}`` by name).
    ``threads``: torch's CPU threads while it runs (the ranks'), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(model, optimizer, d, grad_reduce, steps, micro, batch, loss_fn, max_grad_norm)
    finally:
        torch.set_num_threads(before)


def _train(
    model: nn.Module,
    optimizer: Any,
    d: Degrees,
    grad_reduce: str,
    steps: int,
    micro: int,
    batch: Any,
    loss_fn: Any,
    max_grad_norm: float | None,
) -> tuple[list, dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    units = unit_slots(model)
    padded = [layout.padded_numel(sum(p.numel() for _, p in u), d) for u in units]
    losses, grads_seen = [], []
    for s in range(steps):
        per_unit: list[list[list[torch.Tensor]]] = [[] for _ in units]
        loop = {n: torch.zeros_like(p) for u in units for n, p in u}
        step_losses = []
        for r in range(d.world):
            per_micro = []
            for i in range(len(units)):
                per_unit[i].append([])
            for m in range(micro):
                x, y = batch(s, r, m)
                loss = loss_fn(model(x), y) / micro
                loss.backward()
                per_micro.append(loss.item())
                for i, u in enumerate(units):
                    per_unit[i][r].append(flat_grads(u, padded[i]))
                    for n, p in u:
                        if p.grad is not None:
                            loop[n] += p.grad
                model.zero_grad(set_to_none=True)
            step_losses.append(per_micro)
        losses.append(step_losses)
        ordered = {}
        for i, u in enumerate(units):
            total = reduce_like_plan(per_unit[i], d, grad_reduce)
            offset = 0
            for n, p in u:
                if p.requires_grad:
                    p.grad = total[offset : offset + p.numel()].view_as(p).clone()
                    p.grad.mul_(1.0 / d.world)
                    ordered[n] = p.grad.clone()
                offset += p.numel()
        grads_seen.append({"ordered": ordered, "loop": {n: g / d.world for n, g in loop.items()}})
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, grads_seen
