"""Measured per-tier bandwidth and latency that override a topology's YAML figures.

The table ``zerotopo calibrate`` writes (YAML or JSON; see docs/cost-model.md)::

    topology: frontier          # the topology it was measured on (name)
    nodes: 2                    # optional: node count of the measurement
    date: 2026-11-21T10:00:00Z  # optional: when
    command: zerotopo calibrate --topology frontier   # optional: how
    notes: free text            # optional
    tiers:
      package: {bandwidth_gbps: 182.0, latency_us: 3.1}
      node:    {bandwidth_gbps: 41.5,  latency_us: 6.0}
      network: {bandwidth_gbps: 10.8,  latency_us: 14.0}

Optional sections (see docs/cost-model.md): ``bandwidth:`` measured curves by collective, message size
and group span (:mod:`zerotopo.cost.bandwidth`; they replace the topology's shipped table) and
``overlap:`` the overlap parameters (:class:`zerotopo.cost.time.OverlapModel`), ``device:`` this machine's
measured rates (:mod:`zerotopo.cost.rates`: ``compute_tflops``, the compute rate that replaces peak ×
efficiency, ``quant_gbps``, the block quantizer's rate that replaces the topology's, and ``quantizer``,
its rates by input dtype, code and pass, :mod:`zerotopo.cost.quantrates`, which price ahead of both). At least one
of ``tiers``, ``bandwidth``, ``overlap`` and ``device`` is required.

Every tier bandwidth is GB/s per device, one direction, measured with every device of the machine
communicating across that tier at once: the figure the cost model divides bytes by. For the network tier
that is the node's injection bandwidth divided among its devices, so :func:`apply_calibration` stores
``bandwidth_gbps × devices per node`` as the injection bandwidth. A tier may give either field or both;
tiers left out keep their YAML figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from zerotopo.cost.bandwidth import BandwidthTable, curves_from_list
from zerotopo.cost.quantrates import rates_from_mapping
from zerotopo.cost.time import OverlapModel, overlap_from_mapping
from zerotopo.errors import ConfigError, short
from zerotopo.placement import numbers
from zerotopo.placement.topology import Topology
from zerotopo.placement.yamlio import load_yaml_file

_TOP_REQUIRED = ("topology",)
_TOP_OPTIONAL = ("nodes", "date", "command", "notes", "tiers", "bandwidth", "overlap", "device")
_DEVICE_KEYS = ("compute_tflops", "quant_gbps", "quantizer")
_TIER_KEYS = ("bandwidth_gbps", "latency_us")


def _number(value: Any, source: str, key: str, *, positive: bool) -> float:
    bound = "> 0" if positive else ">= 0"
    out_of_range = f"expected a value {bound} (finite, below 1e9), found {{found}}"
    return numbers.number(
        value,
        above=0 if positive else None,
        minimum=None if positive else 0,
        maximum=1e9,
        messages={
            "type": "expected a number, found {found}",
            "finite": out_of_range,
            "low": out_of_range,
            "high": out_of_range,
        },
        error=lambda message: ConfigError(message, source=source, key=key),
    )


def calibration_from_mapping(raw: Any, source: str = "<calibration>") -> dict[str, Any]:
    """Validate a parsed calibration table; returns ``{topology, tiers: {name: {field: value}}, ...}``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a calibration table must be a mapping, found {type(raw).__name__}", source=source)
    allowed = _TOP_REQUIRED + _TOP_OPTIONAL
    for k in raw:
        if k not in allowed:
            raise ConfigError(
                f"unknown key; expected one of {', '.join(allowed)}", source=source, key=str(k)[:60]
            )
    for k in _TOP_REQUIRED:
        if k not in raw:
            raise ConfigError(f"missing required key {k!r}", source=source, key=k)
    if not any(k in raw for k in ("tiers", "bandwidth", "overlap", "device")):
        raise ConfigError(
            "missing required key 'tiers' (or 'bandwidth' curves, 'overlap' parameters, 'device' rates)",
            source=source,
            key="tiers",
        )
    if not isinstance(raw["topology"], str) or not raw["topology"].strip():
        raise ConfigError(
            f"expected a topology name, found {short(raw['topology'])}", source=source, key="topology"
        )
    if "nodes" in raw and (type(raw["nodes"]) is not int or not 1 <= raw["nodes"] <= 100_000):
        raise ConfigError(
            f"expected a node count from 1 to 100000, found {short(raw['nodes'])}", source=source, key="nodes"
        )
    for k in ("command", "notes"):
        if k in raw and not isinstance(raw[k], str):
            raise ConfigError(f"expected text, found {short(raw[k])}", source=source, key=k)
    tiers = raw.get("tiers", {"__none__": None})
    if tiers == {"__none__": None}:
        tiers = {}
    elif not isinstance(tiers, Mapping) or not tiers:
        raise ConfigError(
            f"expected a mapping of tier name to {{bandwidth_gbps, latency_us}}, found {short(tiers)}",
            source=source,
            key="tiers",
        )
    out_tiers: dict[str, dict[str, float]] = {}
    for name, entry in tiers.items():
        path = f"tiers.{name}"
        if not isinstance(entry, Mapping) or not entry:
            raise ConfigError(
                f"expected a mapping with bandwidth_gbps and/or latency_us, found {short(entry)}",
                source=source,
                key=path,
            )
        for k in entry:
            if k not in _TIER_KEYS:
                raise ConfigError(
                    f"unknown key; expected {', '.join(_TIER_KEYS)}", source=source, key=f"{path}.{k}"
                )
        out_tiers[str(name)] = {
            k: _number(entry[k], source, f"{path}.{k}", positive=(k == "bandwidth_gbps"))
            for k in _TIER_KEYS
            if k in entry
        }
    out = {k: raw[k] for k in _TOP_OPTIONAL if k in raw}
    out.update(topology=raw["topology"].strip(), tiers=out_tiers, source=source)
    if "bandwidth" in raw:
        out["bandwidth"] = BandwidthTable(out["topology"], curves_from_list(raw["bandwidth"], source), source)
    if "overlap" in raw:
        out["overlap"] = overlap_from_mapping(raw["overlap"], source)
    if "device" in raw:
        out["device"] = _device_rates(raw["device"], source)
    return out


def _device_rates(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            f"expected a mapping with {' and/or '.join(_DEVICE_KEYS)}, found {short(raw)}",
            source=source,
            key="device",
        )
    for k in raw:
        if k not in _DEVICE_KEYS:
            raise ConfigError(
                f"unknown key; expected {', '.join(_DEVICE_KEYS)}", source=source, key=f"device.{k}"
            )
    out: dict[str, Any] = {
        k: _number(raw[k], source, f"device.{k}", positive=True) for k in _DEVICE_KEYS[:2] if k in raw
    }
    if "quantizer" in raw:
        out["quantizer"] = rates_from_mapping(raw["quantizer"], source)
    return out


def load_calibration(path: str | Path) -> dict[str, Any]:
    """Read and validate a calibration table (YAML or JSON)."""
    p = Path(path)
    raw = load_yaml_file(p, what="calibration table", hint="write one with `zerotopo calibrate -o FILE`")
    return calibration_from_mapping(raw, source=str(p))


def apply_calibration(topology: Topology, table: Mapping[str, Any]) -> Topology:
    """``topology`` with the measured figures of ``table`` (from :func:`load_calibration`)."""
    source = str(table.get("source", "<calibration>"))
    if table["topology"] != topology.name:
        raise ConfigError(
            f"measured on topology {table['topology']!r} but applied to {topology.name!r}; "
            "calibrate on this machine or pass the matching --topology",
            source=source,
            key="topology",
        )
    tiers = list(topology.tiers)
    network = topology.network
    for name, figures in table["tiers"].items():
        bw, lat = figures.get("bandwidth_gbps"), figures.get("latency_us")
        idx = next((i for i, t in enumerate(tiers) if t.name == name), None)
        if idx is not None:
            t = tiers[idx]
            tiers[idx] = replace(
                t,
                bandwidth_gbps=t.bandwidth_gbps if bw is None else bw,
                latency_us=t.latency_us if lat is None else lat,
            )
        elif name == network.name:
            network = replace(
                network,
                injection_gbps=network.injection_gbps if bw is None else bw * topology.devices_per_node,
                latency_us=network.latency_us if lat is None else lat,
            )
        else:
            raise ConfigError(
                f"unknown tier {short(name)}; topology {topology.name!r} has {', '.join(topology.tier_names)}",
                source=source,
                key=f"tiers.{name}",
            )
    device = topology.device
    if "quant_gbps" in table.get("device", {}):
        device = replace(device, quant_gbps=table["device"]["quant_gbps"])
    if "quantizer" in table.get("device", {}):
        device = replace(device, quant_rates=table["device"]["quantizer"])
    return replace(topology, tiers=tuple(tiers), network=network, device=device)


def calibrated(topology: Topology, path: str | Path) -> tuple[Topology, dict[str, Any]]:
    """``topology`` with the calibration file at ``path`` applied, and the measured inputs of
    :class:`~zerotopo.cost.planner.CostOptions` it brings (its curves in place of the topology's shipped
    table, its overlap figures, its measured compute rate): what ``--calibration FILE`` means to
    ``zerotopo plan`` and ``zerotopo bench compare``."""
    cal = load_calibration(path)
    measured: dict[str, Any] = {
        "bandwidth": cal.get("bandwidth"),
        "default_bandwidth": False,
        "overlap": cal.get("overlap") or OverlapModel(),
    }
    if "compute_tflops" in cal.get("device", {}):
        measured["achieved_tflops"] = cal["device"]["compute_tflops"]
    return apply_calibration(topology, cal), measured
