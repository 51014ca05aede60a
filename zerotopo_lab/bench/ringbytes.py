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

The links also carry what no schedule sends: what the transport adds around each message (gloo's own
framing, and whatever TCP puts on the wire beyond the fixed per-packet headers the payload counter takes
off, such as options in ACKs), which grows with the messages, not with the bytes. So the same walk
counts messages: a ring sends ``d - 1`` messages from each member to the next (an
``all_reduce`` two passes, ``2 (d - 1)``: gloo's ring reduce-scatter then all-gather), an all-to-all
one to each other member. ``bench compare`` divides the cross-node payload the links counted beyond the
schedule's bytes by these messages (``network_excess_bytes_per_message``).
"""

from __future__ import annotations

from typing import Any

ALL_TO_ALL = ("reduce_scatter_int4",)


def _hops(op: str, members: list[int]) -> list[tuple[int, int, float, int]]:
    """``(sender, receiver, share of the sender's bytes_sent, messages)`` of each hop of one call over
    ``members`` (position order)."""
    d = len(members)
    if d < 2:
        return []
    if op in ALL_TO_ALL:
        return [(t, p, 1 / (d - 1), 1) for t in members for p in members if p != t]
    passes = 2 if op == "all_reduce" else 1
    return [(t, members[(i + 1) % d], 1.0, passes * (d - 1)) for i, t in enumerate(members)]


def _tier(topology: Any, a: int, b: int) -> str:
    return topology.tier_of_group((a, b)) or topology.network.name


def group_tier_bytes(op: str, members: list[int], bytes_sent: float, topology: Any) -> dict[str, float]:
    """Bytes one call over ``members`` (topological indices, position order) puts on each tier, summed
    over the members."""
    out: dict[str, float] = {}
    for a, b, share, _ in _hops(op, members):
        tier = _tier(topology, a, b)
        out[tier] = out.get(tier, 0.0) + bytes_sent * share
    return out


def group_tier_messages(op: str, members: list[int], topology: Any) -> dict[str, int]:
    """Messages one call over ``members`` sends on each tier, summed over the members."""
    out: dict[str, int] = {}
    for a, b, _, messages in _hops(op, members):
        tier = _tier(topology, a, b)
        out[tier] = out.get(tier, 0) + messages
    return out


def _walk(schedule: Any, topology: Any, degrees: Any, per_call: Any) -> dict[str, float]:
    """``per_call(collective, members) -> {tier: amount}`` summed over every call of ``schedule`` (times
    its ``count``) and divided by the world: per rank per step, every tier present."""
    from zerotopo.comm.mesh import _index_groups

    out = {t: 0.0 for t in topology.tier_names}
    groups: dict[str, list[list[int]]] = {}
    for c in schedule.collectives():
        if c.group not in groups:
            groups[c.group] = _index_groups(topology, degrees, c.group)
        for members in groups[c.group]:
            if len(members) != c.group_size:  # not this call's groups (a kind the plan shapes otherwise)
                continue
            for tier, amount in per_call(c, members).items():
                out[tier] += amount * c.count
    world = topology.world_size
    return {t: v / world for t, v in out.items()}


def ring_tier_bytes(schedule: Any, topology: Any, degrees: Any) -> dict[str, float]:
    """Bytes per rank per step on each tier of ``topology`` for ``schedule`` (a
    :class:`~zerotopo.placement.schedule.StepSchedule` of a plan with ``degrees``), every tier present."""
    return _walk(schedule, topology, degrees, lambda c, m: group_tier_bytes(c.op, m, c.bytes_sent, topology))


def ring_tier_messages(schedule: Any, topology: Any, degrees: Any) -> dict[str, float]:
    """Messages per rank per step on each tier for ``schedule``, as :func:`ring_tier_bytes` walks it."""
    return _walk(schedule, topology, degrees, lambda c, m: group_tier_messages(c.op, m, topology))
