"""``bench compare --curves frontier-48``: every collective also waits what it would take at scale.

The shaped links give the emulated cluster a bandwidth, but not the shape of a real fabric's curve: on
Frontier, RCCL's bus bandwidth dips for mid-size messages (the slow band of
``topologies/bandwidth/frontier.yaml``), which is where DeepSpeed's per-module gathers land at 384 GCDs.
:func:`install` wraps ``torch.distributed``'s collectives inside a rank process (so the engine's,
DeepSpeed's and FSDP2's calls are all covered) and, before each call, sleeps :func:`replay_wait`: the
time the shipped curve gives for the same op on the matching message and group at 48 nodes, scaled to
this machine. The mapping:

- message: the bench message over the layer-size ratio (:func:`zerotopo.bench.regime.layer_ratio`), in
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


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    numel, size = getattr(value, "numel", None), getattr(value, "element_size", None)
    if numel is None or size is None:
        return 0
    return numel() * min(size(), 2)  # fp32 at the bench stands for bf16 at the target


def target_group(
    ranks: list[int], bench_per_node: int, target_nodes: int, target_per_node: int
) -> tuple[str, int, int]:
    """(tier, nodes, ranks per node) at the target of a bench group of ``ranks``."""
    nodes = {r // bench_per_node for r in ranks}
    per_node = max(1, round(len(ranks) / len(nodes) * target_per_node / bench_per_node))
    if len(nodes) > 1:
        return "network", target_nodes, per_node
    if len(ranks) >= bench_per_node:
        return "node", 1, per_node
    return "package", 1, per_node


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


def install(r: Replay) -> dict[str, float]:
    """Wrap ``torch.distributed``'s collectives in this process (see the module note); returns the
    running totals {op: seconds waited}, updated as the rank runs."""
    import torch.distributed as dist

    from zerotopo.cost.bandwidth import default_table

    topology, nodes = CURVES[r.curves]
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

    def wrap(name: str, fn: Any) -> Any:
        op, arg = OPS[name]
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def waiting(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            values = list(bound.values())
            size = _nbytes(values[arg]) if len(values) > arg else 0
            wait = replay_wait(table, op, size, *span(bound.get("group")), r)
            if wait > 0:
                time.sleep(wait)
                waited[op] = waited.get(op, 0.0) + wait
            return fn(*args, **kwargs)

        return waiting

    for name in OPS:
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__wrapped__"):
            setattr(dist, name, wrap(name, fn))
    # the engine's collectives bind their all-gather and reduce-scatter at import
    from zerotopo.comm import collectives

    collectives._ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    collectives._REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return waited
