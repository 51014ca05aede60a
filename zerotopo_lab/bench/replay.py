"""``bench compare --curves frontier-48``: every collective also waits what it would take at scale.

The shaped links give the emulated cluster a bandwidth, but not the shape of a real fabric's curve: on
Frontier, RCCL's bus bandwidth dips for mid-size messages (the slow band of
``topologies/bandwidth/frontier.yaml``), which is where DeepSpeed's per-module gathers land at 384 GCDs.
:func:`install` wraps ``torch.distributed``'s collectives inside a rank process (so the engine's,
DeepSpeed's and FSDP2's calls are all covered) and makes the thread that issues each call wait
:func:`replay_wait` from the moment it issues it: the time the shipped curve gives for the same op on the
matching message and group at 48 nodes, scaled to this machine. The real message crosses the links
inside that time (:func:`pace`): the curve's time is the whole collective's, as at scale, and the
transport of the small model's messages (at the links' fastest rate, but through gloo's threads on
ranks that share a few cores) adds to a call only where it outlasts the curve. The mapping:

- message: the bench message over the layer-size ratio (:func:`zerotopo_lab.bench.regime.layer_ratio`), in
  bf16 (under `--dtype fp32` an fp32 element counts 2 bytes), so a bench layer's gather stands for a NeoX-20B layer's;
- group: one that crosses nodes spans the target's 48 nodes with the same share of each node's devices;
  one inside a node spans a Frontier node's 8 GCDs at the same share; a tier without a curve (the
  package) waits nothing;
- time: the curve's time times ``scale``, the bench's compute per micro-batch over the target's, so a
  collective is the same fraction of a micro-batch's compute as at scale.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPS = {
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_single": ("all_gather", 0),
    "_all_gather_base": ("all_gather", 0),
    "all_gather": ("all_gather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "all_reduce": ("all_reduce", 0),
    "all_to_all_single": ("all_to_all", 1),
}
"""torch.distributed function -> (curve op, index of the argument whose size is the message)."""
CURVES = {"frontier-48": ("frontier", 48)}
"""``--curves`` names: (topology whose shipped table is replayed, its node count)."""


@dataclass(frozen=True)
class Replay:
    """What a rank needs to compute its waits; picklable."""

    curves: str
    layer_ratio: float
    scale: float
    """Bench compute per micro-batch over the target's."""
    bench_per_node: int
    target_per_node: int = 8
    nodes: int | None = None
    """Node count whose spans the curves are read at (None: the curves' own, 48; the device clock: the
    emulated count)."""


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    numel, size = getattr(value, "numel", None), getattr(value, "element_size", None)
    if numel is None or size is None:
        return 0
    return target_bytes(numel(), size())


def target_bytes(numel: int, itemsize: int) -> int:
    """Bytes of a bench message as the target sends it: bf16 or narrower (an fp32 element at the bench,
    under ``--dtype fp32``, stands for a bf16 one)."""
    return numel * min(itemsize, 2)


def target_group(
    ranks: list[int], bench_per_node: int, target_nodes: int, target_per_node: int
) -> tuple[str, int, int]:
    """(tier, nodes, ranks per node) at the target of a bench group of ``ranks``."""
    nodes = len({r // bench_per_node for r in ranks})
    return target_span(nodes, len(ranks), bench_per_node, target_nodes, target_per_node)


def target_span(
    nodes: int, size: int, bench_per_node: int, target_nodes: int, target_per_node: int
) -> tuple[str, int, int]:
    """(tier, nodes, ranks per node) at the target of a bench group of ``size`` ranks over ``nodes``."""
    per_node = max(1, round(size / nodes * target_per_node / bench_per_node))
    if nodes > 1:
        return "network", target_nodes, per_node
    if size >= bench_per_node:
        return "node", 1, per_node
    return "package", 1, per_node


def schedule_wait(schedule: Any, r: Replay) -> float:
    """Seconds one step of ``schedule`` (:class:`zerotopo.placement.schedule.StepSchedule`) waits under
    ``r``: :func:`replay_wait` of each collective call, as :func:`install` computes it for the call the
    rank makes (the whole message, at most 2 bytes per element). The ranks sleep on the thread that
    computes, so a prediction adds this to the step."""
    from zerotopo.cost.bandwidth import OP_FAMILY, default_table

    topology, nodes = CURVES[r.curves]
    nodes = r.nodes or nodes
    table = default_table(topology)
    total = 0.0
    for c in schedule.collectives():
        size = c.message_bytes // 2 if c.dtype == "fp32" else c.message_bytes  # as target_bytes
        span = target_span(c.nodes, c.group_size, r.bench_per_node, nodes, r.target_per_node)
        total += c.count * replay_wait(table, OP_FAMILY.get(c.op, c.op), size, *span, r)
    return total


def replay_wait(
    table: Any, op: str, message_bytes: float, tier: str, nodes: int, per_node: int, r: Replay
) -> float:
    """Seconds a collective waits: the curve's time for ``op`` on ``message_bytes / layer_ratio`` over
    ``nodes`` x ``per_node`` at ``tier``, times ``r.scale`` (0 when the table has no curve for it)."""
    size = message_bytes / r.layer_ratio
    busbw = table.busbw(op, size, tier, nodes, per_node)
    n = nodes * per_node
    if not busbw or n < 2:
        return 0.0
    factor = 2.0 if op == "all_reduce" else 1.0
    return factor * (n - 1) / n * size / (busbw * 1e9) * r.scale


def pace(seconds: float, start: float) -> None:
    """Sleep until ``seconds`` have passed since ``start`` (:func:`time.perf_counter`): a replayed call
    waits its curve's time from its issue, its real transport (a blocking call's, or an asynchronous
    one's running behind the sleep) inside it; no sleep when the call already took longer."""
    rest = start + seconds - time.perf_counter()
    if rest > 0:
        time.sleep(rest)


def install(r: Replay) -> dict[str, float]:
    """Wrap ``torch.distributed``'s collectives in this process and observe the engine's
    (:func:`zerotopo.comm.collectives.observe_collectives`: its reduce-scatter on gloo is a ring of
    point-to-point sends no wrapper sees); returns the running totals {op: curve seconds the calls were
    paced to} (a call whose transport outlasts its curve took longer), updated as the rank runs."""
    import torch.distributed as dist

    from zerotopo.comm import collectives
    from zerotopo.cost.bandwidth import OP_FAMILY, default_table

    topology, nodes = CURVES[r.curves]
    nodes = r.nodes or nodes
    table = default_table(topology)
    waited: dict[str, float] = {}
    spans: dict[Any, tuple[str, int, int]] = {}

    def span(group: Any) -> tuple[str, int, int]:
        key = id(group) if group is not None else None
        if key not in spans:
            ranks = (
                dist.get_process_group_ranks(group)
                if group is not None
                else list(range(dist.get_world_size()))
            )
            spans[key] = target_group(ranks, r.bench_per_node, nodes, r.target_per_node)
        return spans[key]

    def pacing(op: str, size: float, group: Any) -> Callable[[], None] | None:
        """The call's pacing, to run once it is issued (None: the curve has no time for it)."""
        seconds = replay_wait(table, op, size, *span(group), r)
        if seconds <= 0:
            return None
        waited[op] = waited.get(op, 0.0) + seconds
        return functools.partial(pace, seconds, time.perf_counter())

    def wrap(name: str, fn: Any) -> Any:
        op, arg = OPS[name]
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def waiting(*args: Any, **kwargs: Any) -> Any:
            if collectives.issuing():  # the engine's calls: observed below, once per collective
                return fn(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            values = list(bound.values())
            issued = pacing(op, _nbytes(values[arg]) if len(values) > arg else 0, bound.get("group"))
            out = fn(*args, **kwargs)
            if issued is not None:
                issued()
            return out

        waiting._replayed = True  # type: ignore[attr-defined]
        return waiting

    def engine(op: str, group: Any, numel: int, itemsize: int) -> Callable[[], None] | None:
        family = OP_FAMILY.get(op)
        if family in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
            return pacing(family, target_bytes(numel, itemsize), group)
        return None

    for name in OPS:
        fn = getattr(dist, name, None)
        # torch's own functions carry __wrapped__ (its exception logger): mark ours instead
        if fn is not None and not getattr(fn, "_replayed", False):
            setattr(dist, name, wrap(name, fn))
    collectives.observe_collectives(engine)
    return waited
