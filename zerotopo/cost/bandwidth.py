"""Measured collective bandwidth by (collective, message size, group span), interpolated in log size.

[Note: bandwidth table] Chen et al., "Lins: Reducing Communication Overhead of ZeRO for Efficient LLM
Training" (IWQoS 2024, doi:10.1109/IWQoS61813.2024.10682856) §IV-A times a collective as ``v / w(o, v,
p⁰×p¹)``: an effective
bandwidth profiled per operator ``o``, message size ``v`` and device mesh (ranks per node × nodes),
interpolated where ``v`` was not profiled. A :class:`BandwidthTable` holds such curves::

    entries:
      - op: all_gather          # all_gather | reduce_scatter | all_reduce | all_to_all
        tier: network           # the outermost tier the group crosses
        nodes: 2                # nodes the group spans
        ranks_per_node: 8       # ranks of the group in each node
        sizes: [1048576, ...]   # whole message in bytes: gathered output / reduce input / buffer
        busbw_gbps: [0.136, ...]  # bytes one rank sends / time, GB/s, every group of the span at once
        source: where the figures come from

``busbw`` is the NCCL/RCCL-tests *bus bandwidth* (``(d-1)/d · size / time`` for an all-gather or a
reduce-scatter, ``2(d-1)/d · size / time`` for an all-reduce), which is exactly the bytes one rank sends
(:mod:`zerotopo.placement.volume`) divided by the time: a call takes ``bytes_sent / busbw``.

Lookup (:meth:`BandwidthTable.busbw`):

1. the op's family (int8 gathers are all-gathers; the int4 reduce-scatter is an all-to-all); an
   all-reduce or all-to-all without curves of its own uses the reduce-scatter curves of the span;
2. curves of the same tier and ranks per node; between two measured node counts, each curve is read at
   the same *per-rank chunk* (message × measured nodes / nodes) and the two are interpolated in log
   nodes (RCCL's slow band follows the per-rank chunk, not the message: see topologies/bandwidth);
   outside the measured node counts the nearest curve is read at the same chunk;
3. across nodes with fewer ranks per node than any curve (a replica group of one rank per node: eight
   such groups share a node's NICs), the curve with the most ranks per node ``R`` is read at
   ``message × R/r`` (same chunk per node crossing) and scaled by ``r/R``: a ring leaves each node once
   per group, so ``R/r`` times as many groups share the node's injection bandwidth;
4. within a curve, linear in log message size, clamped at the measured ends.

No curve: the topology's alpha-beta figures (:func:`zerotopo.cost.time.collective_time`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zerotopo.errors import ConfigError
from zerotopo.placement import numbers
from zerotopo.sizes import parse_size

FAMILIES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
#: Ledger op -> the curve family that times it.
OP_FAMILY = {
    "all_gather": "all_gather",
    "all_gather_int8": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_int4": "all_to_all",
    "all_to_all": "all_to_all",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
}
#: Families timed by another's curves when they have none of their own (a ring all-reduce is a
#: reduce-scatter then an all-gather over the same links; an all-to-all moves the same bytes per rank).
FALLBACK = {"all_reduce": "reduce_scatter", "all_to_all": "reduce_scatter", "broadcast": "all_gather"}


@dataclass(frozen=True)
class Curve:
    """Bus bandwidth against message size for one collective over one group span."""

    op: str
    tier: str
    nodes: int
    ranks_per_node: int
    sizes: tuple[int, ...]
    busbw_gbps: tuple[float, ...]
    source: str = ""

    def at(self, message_bytes: float) -> float:
        """GB/s for a message of ``message_bytes``: linear in log size, clamped at the ends."""
        xs = self.sizes
        if message_bytes <= xs[0]:
            return self.busbw_gbps[0]
        if message_bytes >= xs[-1]:
            return self.busbw_gbps[-1]
        j = bisect.bisect_right(xs, message_bytes)
        x0, x1 = math.log(xs[j - 1]), math.log(xs[j])
        f = (math.log(message_bytes) - x0) / (x1 - x0)
        return self.busbw_gbps[j - 1] + f * (self.busbw_gbps[j] - self.busbw_gbps[j - 1])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.op,
            "tier": self.tier,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "sizes": list(self.sizes),
            "busbw_gbps": [round(x, 4) for x in self.busbw_gbps],
        }
        if self.source:
            out["source"] = self.source
        return out


@dataclass(frozen=True)
class BandwidthTable:
    """Measured curves for one topology (see the module note)."""

    topology: str
    curves: tuple[Curve, ...]
    source: str = "<table>"
    fallback: tuple[tuple[str, str], ...] = ()
    """Families timed by another's curves in this table, beyond :data:`FALLBACK` (a set measured
    without all-gathers: ``(("all_gather", "reduce_scatter"),)``)."""

    def _matching(self, family: str, tier: str) -> list[Curve]:
        return [c for c in self.curves if c.op == family and c.tier == tier]

    def busbw(
        self, op: str, message_bytes: float, tier: str, nodes: int, ranks_per_node: int
    ) -> float | None:
        """Bus bandwidth (GB/s) of ``op`` on a message of ``message_bytes`` over a group spanning
        ``nodes`` × ``ranks_per_node`` crossing ``tier``; None when no curve applies."""
        family = OP_FAMILY.get(op, op)
        for fam in (family, dict(self.fallback).get(family) or FALLBACK.get(family)):
            if fam is None:
                continue
            cands = self._matching(fam, tier)
            if not cands:
                continue
            same = [c for c in cands if c.ranks_per_node == ranks_per_node]
            if same:
                return _over_nodes(same, message_bytes, nodes)
            wider = [c for c in cands if c.ranks_per_node > ranks_per_node and c.nodes > 1]
            if wider and nodes > 1:
                R = max(c.ranks_per_node for c in wider)
                top = [c for c in wider if c.ranks_per_node == R]
                scale = ranks_per_node / R
                return _over_nodes(top, message_bytes / scale, nodes) * scale
            return None
        return None

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.curves]


def _over_nodes(curves: list[Curve], message_bytes: float, nodes: int) -> float:
    """Interpolate between the curves measured at the node counts around ``nodes`` (same per-rank chunk)."""
    by_nodes = sorted(curves, key=lambda c: c.nodes)
    counts = [c.nodes for c in by_nodes]
    if nodes in counts:
        return by_nodes[counts.index(nodes)].at(message_bytes)
    j = bisect.bisect_left(counts, nodes)
    if j == 0 or j == len(counts):
        c = by_nodes[0 if j == 0 else -1]
        return c.at(message_bytes * c.nodes / nodes)
    lo, hi = by_nodes[j - 1], by_nodes[j]
    b_lo = lo.at(message_bytes * lo.nodes / nodes)
    b_hi = hi.at(message_bytes * hi.nodes / nodes)
    f = (math.log(nodes) - math.log(lo.nodes)) / (math.log(hi.nodes) - math.log(lo.nodes))
    return b_lo + f * (b_hi - b_lo)


def _positive_int(value: Any, source: str, key: str) -> int:
    return numbers.number(
        value,
        integer=True,
        whole_floats=False,
        minimum=1,
        messages="expected a positive integer, found {found}",
        error=lambda message: ConfigError(message, source=source, key=key),
    )


def curves_from_list(raw: Any, source: str, key: str = "bandwidth") -> tuple[Curve, ...]:
    """Validate a list of curve mappings (the ``bandwidth:`` section of a table)."""
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ConfigError(f"expected a list of curves, found {raw!r}", source=source, key=key)
    out = []
    allowed = ("op", "tier", "nodes", "ranks_per_node", "sizes", "busbw_gbps", "source")
    for i, e in enumerate(raw):
        path = f"{key}[{i}]"
        if not isinstance(e, Mapping):
            raise ConfigError(f"expected a mapping, found {e!r}", source=source, key=path)
        for k in e:
            if k not in allowed:
                raise ConfigError(
                    f"unknown key; expected {', '.join(allowed)}", source=source, key=f"{path}.{k}"
                )
        for k in allowed[:-1]:
            if k not in e:
                raise ConfigError(f"missing required key {k!r}", source=source, key=f"{path}.{k}")
        op = e["op"]
        if op not in FAMILIES:
            raise ConfigError(
                f"unknown op {op!r}; expected one of {', '.join(FAMILIES)}", source=source, key=f"{path}.op"
            )
        if not isinstance(e["tier"], str) or not e["tier"]:
            raise ConfigError(f"expected a tier name, found {e['tier']!r}", source=source, key=f"{path}.tier")
        sizes, bws = e["sizes"], e["busbw_gbps"]
        if not isinstance(sizes, list) or not isinstance(bws, list) or not sizes or len(sizes) != len(bws):
            raise ConfigError(
                "sizes and busbw_gbps must be non-empty lists of the same length", source=source, key=path
            )
        xs = [
            parse_size(s, key=f"{path}.sizes[{j}]", example="1048576, 1M", source=source)
            for j, s in enumerate(sizes)
        ]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ConfigError("sizes must increase", source=source, key=f"{path}.sizes")
        ys = []
        for j, b in enumerate(bws):
            where = f"{path}.busbw_gbps[{j}]"
            ys.append(
                numbers.number(
                    b,
                    above=0,
                    messages="expected a bandwidth > 0, found {found}",
                    error=lambda message, where=where: ConfigError(message, source=source, key=where),
                )
            )
        out.append(
            Curve(
                op,
                e["tier"],
                _positive_int(e["nodes"], source, f"{path}.nodes"),
                _positive_int(e["ranks_per_node"], source, f"{path}.ranks_per_node"),
                tuple(xs),
                tuple(ys),
                str(e.get("source", "")),
            )
        )
    return tuple(out)


def table_from_mapping(raw: Any, source: str = "<table>") -> BandwidthTable:
    """A table from a parsed file: ``{topology: NAME, bandwidth: [curves], ...}`` (other keys ignored,
    so a calibration file is also a table)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a bandwidth table must be a mapping, found {type(raw).__name__}", source=source)
    if not isinstance(raw.get("topology"), str):
        raise ConfigError("missing required key 'topology'", source=source, key="topology")
    if "bandwidth" not in raw:
        raise ConfigError(
            "missing required key 'bandwidth' (a list of curves)", source=source, key="bandwidth"
        )
    return BandwidthTable(
        raw["topology"], curves_from_list(raw["bandwidth"], source), source, _fallback(raw, source)
    )


def _fallback(raw: Mapping, source: str) -> tuple[tuple[str, str], ...]:
    """A table's ``fallback: {family: family}`` mapping, checked."""
    fb = raw.get("fallback", {})
    if not isinstance(fb, Mapping) or not all(k in FAMILIES and v in FAMILIES for k, v in fb.items()):
        raise ConfigError(
            f"expected a mapping of collective families ({', '.join(FAMILIES)}), found {fb!r}",
            source=source,
            key="fallback",
        )
    return tuple(sorted(fb.items()))


def tables_dir() -> Path:
    """Directory of the default tables shipped with the built-in topologies (``topologies/bandwidth``)."""
    from zerotopo import resources

    return resources.builtin_dir("topologies") / "bandwidth"


def load_table(path: str | Path) -> BandwidthTable:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"bandwidth table {str(p)!r} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=str(p)) from None
    return table_from_mapping(raw, source=str(p))


_DEFAULTS: dict[str, BandwidthTable | None] = {}


def curve_set(topology_name: str, name: str) -> BandwidthTable:
    """A shipped curve set of a built-in topology: ``default`` (``topologies/bandwidth/NAME.yaml``) or
    another measured set ``topologies/bandwidth/NAME-SET.yaml`` (frontier: ``rdzv0``)."""
    if name == "default":
        table = default_table(topology_name)
        if table is None:
            raise ConfigError(f"topology {topology_name!r} ships no bandwidth curves", source="--curves")
        return table
    p = tables_dir() / f"{topology_name}-{name}.yaml"
    table = load_table(p) if p.is_file() else None
    if table is None or table.topology != topology_name:  # emulated-frontier.yaml is no set of emulated
        sets = [
            x.stem[len(topology_name) + 1 :]
            for x in sorted(tables_dir().glob(f"{topology_name}-*.yaml"))
            if load_table(x).topology == topology_name
        ]
        raise ConfigError(
            f"no curve set {name!r} for topology {topology_name!r}; sets: {', '.join(['default', *sets])}",
            source="--curves",
        )
    return table


def default_table(topology_name: str) -> BandwidthTable | None:
    """The table shipped for a built-in topology (``topologies/bandwidth/NAME.yaml``), if any."""
    if topology_name not in _DEFAULTS:
        p = tables_dir() / f"{topology_name}.yaml"
        _DEFAULTS[topology_name] = load_table(p) if p.is_file() else None
    return _DEFAULTS[topology_name]
