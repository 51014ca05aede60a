"""The shard layout: which chunk of a unit's flat buffer each rank owns, and the groups that move them.

[Note: shard layout] Each unit (a layer, the embedding, the head) is flattened into one buffer padded to
a multiple of every degree. With nested degrees ``p | g | o`` a rank at topological index ``t`` has the
mixed-radix digits::

    a = t mod p              (position in its parameter group)
    b = (t mod g) div p      (which parameter group inside its gradient group)
    c = (t mod o) div g      (which gradient group inside its optimizer group)

and owns parameter chunk ``a`` of ``p``, gradient chunk ``a·(g/p) + b`` of ``g`` and optimizer chunk
``a·(o/p) + b·(o/g) + c`` of ``o``. The innermost coordinate ``a`` is the most significant chunk digit, so
a rank's optimizer chunk lies inside its gradient chunk, which lies inside its parameter chunk: the
optimizer step needs no extra communication. Groups are built from consecutive topological indices
(the machine's tiers), so a reduce-scatter over the gradient group hands group position ``i`` the chunk
``grad_chunk(i)``, not chunk ``i``: the input is permuted when it is staged
(:func:`reduce_scatter_order`). The secondary partition is cut from the full weight, so its chunk is
simply the position in its group.

Everything here is pure arithmetic on topological indices; :mod:`zerotopo.comm.mesh` maps indices to
ranks and builds the process groups.
"""

from __future__ import annotations

import math

from zerotopo.placement.plan import Degrees

# -- ownership --------------------------------------------------------------------------------------


def digits(t: int, d: Degrees) -> tuple[int, int, int]:
    """The mixed-radix digits ``(a, b, c)`` of topological index ``t`` (see the module note)."""
    return t % d.params, (t % d.grads) // d.params, (t % d.optim) // d.grads


def param_chunk(t: int, d: Degrees) -> int:
    """Index of the parameter chunk (of ``d.params``) that rank ``t`` holds."""
    return t % d.params


def grad_chunk(t: int, d: Degrees) -> int:
    """Index of the gradient chunk (of ``d.grads``) that rank ``t`` holds."""
    a, b, _ = digits(t, d)
    return a * (d.grads // d.params) + b


def optim_chunk(t: int, d: Degrees) -> int:
    """Index of the optimizer chunk (of ``d.optim``) that rank ``t`` holds."""
    a, b, c = digits(t, d)
    return a * (d.optim // d.params) + b * (d.optim // d.grads) + c


def secondary_chunk(t: int, d: Degrees) -> int:
    """Index of the secondary-partition chunk (of ``d.secondary``) that rank ``t`` holds."""
    if d.secondary is None:
        raise ValueError("this plan has no secondary partition")
    return t % d.secondary


def padded_numel(numel: int, d: Degrees, align: int = 2) -> int:
    """Flat-buffer length: a multiple of every degree (and of ``align`` per optimizer chunk, so int4
    packing two values per byte never splits a chunk)."""
    unit = math.lcm(d.optim, d.secondary or 1, d.params, d.grads) * align
    return -(-numel // unit) * unit if numel else unit


def chunk_range(index: int, count: int, numel: int) -> tuple[int, int]:
    """``[start, stop)`` of chunk ``index`` of ``count`` equal chunks of a buffer of ``numel``."""
    if numel % count:
        raise ValueError(f"buffer of {numel} elements does not split into {count} chunks")
    size = numel // count
    return index * size, (index + 1) * size


def param_range(t: int, d: Degrees, numel: int) -> tuple[int, int]:
    return chunk_range(param_chunk(t, d), d.params, numel)


def grad_range(t: int, d: Degrees, numel: int) -> tuple[int, int]:
    return chunk_range(grad_chunk(t, d), d.grads, numel)


def optim_range(t: int, d: Degrees, numel: int) -> tuple[int, int]:
    return chunk_range(optim_chunk(t, d), d.optim, numel)


def secondary_range(t: int, d: Degrees, numel: int) -> tuple[int, int]:
    assert d.secondary is not None
    return chunk_range(secondary_chunk(t, d), d.secondary, numel)


# -- groups (lists of topological indices, each ordered by index) -----------------------------------


def blocks(world: int, size: int) -> list[list[int]]:
    """Consecutive blocks of ``size`` indices: one instance of a tier-aligned group each."""
    return [list(range(s, s + size)) for s in range(0, world, size)]


def strided(world: int, block: int, stride: int) -> list[list[int]]:
    """Groups of indices ``stride`` apart inside each consecutive block of ``block`` indices: the ranks
    of a block that share ``t mod stride``."""
    return [
        list(range(base + r, base + block, stride)) for base in range(0, world, block) for r in range(stride)
    ]


def groups(d: Degrees, kind: str) -> list[list[int]]:
    """Every group of one kind, as lists of topological indices.

    - ``params``: gather the primary parameters (forward).
    - ``secondary``: gather the secondary partition (backward), when the plan has one.
    - ``grads``: reduce-scatter each micro-batch's gradients.
    - ``optim``: one full copy of the optimizer states (the global gradient norm sums over it once).
    - ``grad_replicas``: all-reduce a gradient shard across the replicas of the gradient group
      (ranks with equal ``t mod g``; the papers' all-reduce + select).
    - ``optim_scatter``: reduce-scatter a gradient shard into optimizer chunks (ranks of one optimizer
      group with equal ``t mod g``).
    - ``optim_replicas``: all-reduce an optimizer-chunk gradient across optimizer replicas
      (ranks with equal ``t mod o``).
    - ``param_gather``: all-gather updated optimizer chunks back into parameter chunks (ranks of one
      optimizer group with equal ``t mod p``).
    """
    w = d.world
    if kind == "params":
        return blocks(w, d.params)
    if kind == "secondary":
        if d.secondary is None:
            return []
        return blocks(w, d.secondary)
    if kind == "grads":
        return blocks(w, d.grads)
    if kind == "optim":
        return blocks(w, d.optim)
    if kind == "grad_replicas":
        return strided(w, w, d.grads)
    if kind == "optim_scatter":
        return strided(w, d.optim, d.grads)
    if kind == "optim_replicas":
        return strided(w, w, d.optim)
    if kind == "param_gather":
        return strided(w, d.optim, d.params)
    raise ValueError(f"unknown group kind {kind!r}")


GROUP_KINDS = (
    "params",
    "secondary",
    "grads",
    "grad_replicas",
    "optim_scatter",
    "optim_replicas",
    "param_gather",
)


def group_of(t: int, d: Degrees, kind: str) -> list[int]:
    """The group of ``kind`` that contains topological index ``t``."""
    for g in groups(d, kind):
        if t in g:
            return g
    raise ValueError(f"index {t} is in no {kind} group")


# -- chunk orders of the collectives ----------------------------------------------------------------


def reduce_scatter_order(d: Degrees) -> list[int]:
    """For a gradient group: the gradient chunk that group position ``i`` must receive.

    Stage the reduce-scatter input as ``cat(chunk[order[0]], chunk[order[1]], ...)`` so that a plain
    reduce-scatter (position ``i`` gets input block ``i``) delivers each rank its own gradient chunk.
    """
    return [grad_chunk(i, d) for i in range(d.grads)]


def param_gather_order(d: Degrees) -> list[int]:
    """For a ``param_gather`` group: the optimizer sub-chunk (of ``o/p`` inside one parameter chunk)
    that group position ``k`` contributes. An all-gather yields blocks in position order; block ``k``
    belongs at sub-chunk ``order[k]`` of the parameter chunk."""
    n = d.optim // d.params
    out = []
    for k in range(n):
        t = k * d.params  # a representative index at position k (a = 0)
        out.append(optim_chunk(t, d) - param_chunk(t, d) * n)
    return out


def optim_scatter_order(d: Degrees) -> list[int]:
    """For an ``optim_scatter`` group: the optimizer sub-chunk (of ``o/g`` inside one gradient chunk)
    that position ``k`` receives. Ranks ``g`` apart differ only in digit ``c``, so this is the identity;
    it is kept explicit so the engine never assumes it."""
    n = d.optim // d.grads
    return [(optim_chunk(k * d.grads, d) - grad_chunk(k * d.grads, d) * n) for k in range(n)]
