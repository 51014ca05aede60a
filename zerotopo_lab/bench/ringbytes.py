"""A schedule's bytes per tier as the links count them: every hop of every call in the tier it crosses.

The schedule prices a collective on the outermost tier its group spans, with every byte a rank sends
(:attr:`zerotopo.placement.schedule.Collective.bytes_sent`). The shaped links of the emulated cluster
count each byte in the tier of its own hop: in a ring over ``[0, 2, 4, 6]`` of 2 nodes of 4, the hops
0→2 and 4→6 stay inside a node. So ``bench compare`` sets the links' counters beside this accounting:

- ``all_gather``, ``all_gather_int8``, ``reduce_scatter`` and ``all_reduce`` run as rings in the group's
  position order (gloo's all-gather and all-reduce; the engine's reduce-scatter on gloo,
  :func:`zerotopo.comm.collectives._ring_reduce_scatter`): each member sends its ``bytes_sent`` to the
  next member;
- ``reduce_scatter_int4`` is an all-to-all: each member sends ``bytes_sent / (d - 1)`` to every other.

The mean over the world's ranks per tier, per step (each call times its ``count``).
"""

from __future__ import annotations

from typing import Any

ALL_TO_ALL = ("reduce_scatter_int4",)


def group_tier_bytes(op: str, members: list[int], bytes_sent: float, topology: Any) -> dict[str, float]:
    """Bytes one call over ``members`` (topological indices, position order) puts on each tier, summed
    over the members."""
    d = len(members)
    out: dict[str, float] = {}
    if d < 2:
        return out

    def add(a: int, b: int, nbytes: float) -> None:
        tier = topology.tier_of_group((a, b)) or topology.network.name
        out[tier] = out.get(tier, 0.0) + nbytes

    for i, t in enumerate(members):
        if op in ALL_TO_ALL:
            for peer in members:
                if peer != t:
                    add(t, peer, bytes_sent / (d - 1))
        else:
            add(t, members[(i + 1) % d], bytes_sent)
    return out


def ring_tier_bytes(schedule: Any, topology: Any, degrees: Any) -> dict[str, float]:
    """Bytes per rank per step on each tier of ``topology`` for ``schedule`` (a
    :class:`~zerotopo.placement.schedule.StepSchedule` of a plan with ``degrees``), every tier present."""
    from zerotopo.comm.mesh import _index_groups

    out = {t: 0.0 for t in topology.tier_names}
    groups: dict[str, list[list[int]]] = {}
    for c in schedule.collectives():
        if c.group not in groups:
            groups[c.group] = _index_groups(topology, degrees, c.group)
        for members in groups[c.group]:
            if len(members) != c.group_size:  # not this call's groups (a kind the plan shapes otherwise)
                continue
            for tier, nbytes in group_tier_bytes(c.op, members, c.bytes_sent, topology).items():
                out[tier] += nbytes * c.count
    world = topology.world_size
    return {t: b / world for t, b in out.items()}
