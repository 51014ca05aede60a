"""The machine as a tree of bandwidth tiers.

A node is a tree of tiers, innermost first (Frontier: GCD → package of 2 GCDs → node of 4 packages);
the job joins nodes over a network. Each tier has a fan-out (children per instance), a per-device
bandwidth when every device of the machine talks at once (GB/s, one direction) and a latency; the
network has a per-node injection bandwidth, shared by the node's devices.

Ranks are placed by *topological index*: die fastest, then package, then node. A group of consecutive
topological indices of size ``tier_size(tier)`` is one instance of that tier, so shard groups follow the
machine. [Note: topological index] The launcher's rank order is not always topological: under Frontier's
``srun --gpu-bind=closest`` local ranks 0..7 land on GCDs 4,5,2,3,6,7,0,1; ``device_order`` records
that, and :meth:`Topology.topological_index` maps a rank to its place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zerotopo import resources
from zerotopo.errors import ConfigError, short
from zerotopo.placement.numbers import PROBLEMS, number
from zerotopo.placement.yamlio import load_yaml_file

#: Names a degree may use besides tier names.
DEVICE_NAMES = ("device", "die", "gcd", "gpu")
WORLD_NAMES = ("world", "job")
#: The innermost tier of the node, whatever it is called (Frontier: package; DGX: node).
INNER_NAMES = ("inner",)

#: Bounds checked before anything is sized by them (the largest machines are far inside them).
MAX_NODES = 100_000
MAX_FANOUT = 4096
MAX_DEVICES_PER_NODE = 4096
MAX_TIERS = 16
MAX_NAME_CHARS = 128
#: Upper bounds of per-field figures: GB/s, microseconds, GiB, TFLOPS.
_MAX_VALUE = {
    "bandwidth_gbps": 1e7,
    "injection_gbps": 1e7,
    "latency_us": 1e9,
    "memory_gib": 1e7,
    "peak_tflops": 1e7,
    "quant_gbps": 1e7,
    "memory_bandwidth_gbps": 1e7,
    "comm_cpu_us_per_call": 1e9,
    "comm_cpu_us_per_mb": 1e9,
}


@dataclass(frozen=True)
class Tier:
    """One level of the node's tree."""

    name: str
    """Tier name, used as a degree (``package``) and as a key in per-tier byte counts."""
    fanout: int
    """Children per instance of this tier (GCDs per package, packages per node)."""
    bandwidth_gbps: float
    """GB/s per device, per direction, when every device communicates across this tier at once."""
    latency_us: float
    """Latency of one message across this tier, microseconds."""


@dataclass(frozen=True)
class Network:
    """The fabric between nodes."""

    name: str
    """Tier name of the inter-node fabric (used as a key in per-tier byte counts)."""
    injection_gbps: float
    """GB/s per node, per direction (all NICs together); the node's devices share it."""
    latency_us: float
    """Latency of one message between nodes, microseconds."""


@dataclass(frozen=True)
class Device:
    """One accelerator (a GCD on Frontier)."""

    name: str
    """Human-readable device name."""
    memory_gib: float
    """Device memory in GiB."""
    peak_tflops: float
    """Peak dense bf16/fp16 TFLOPS of one device (0 when unknown: MFU is then not reported)."""
    quant_gbps: float = 0.0
    """Rate of the int8/int4 block quantizer on one device, in GB/s of fp32 values passed over (quantize or
    dequantize); the cost model charges each quantized collective's passes at it. 0: unknown, not charged."""
    host_reduce: bool = False
    """The ranks reduce each micro-batch's gradients on the thread that computes (CPU ranks: no side
    stream), so the cost model lets the backward wait for each reduction (``OverlapModel.host_reduce``)."""
    memory_bandwidth_gbps: float = 0.0
    """Peak memory (HBM) bandwidth of one device, GB/s. Without a measured ``quant_gbps`` the cost model
    prices the quantizer's kernels by the bytes they move at this rate (a roofline). 0: unknown."""
    comm_cpu_us_per_call: float = 0.0
    """Compute microseconds one rank loses to the transport of each collective call it makes: CPU ranks,
    whose transport is processor work on the cores the compute runs on (:mod:`zerotopo_lab.bench.transport`
    measures it). 0: none (a GPU's NIC and communication kernels run beside the compute)."""
    comm_cpu_us_per_mb: float = 0.0
    """As :attr:`comm_cpu_us_per_call`, per MB (10^6 bytes) the rank sends."""
    quant_rates: tuple[tuple[str, str, str, float], ...] = ()
    """The quantizer's measured rates by input dtype, code and pass, ``(dtype, code, pass, G values/s)``
    rows (:mod:`zerotopo.cost.quantrates`; a calibration table's ``device.quantizer``): they price a
    collective's passes ahead of :attr:`quant_gbps` and the roofline. Empty: not measured."""


@dataclass(frozen=True)
class Topology:
    """A validated machine description: device, node tiers, network and node count."""

    name: str
    device: Device
    tiers: tuple[Tier, ...]
    network: Network
    nodes: int = 1
    device_order: tuple[int, ...] | None = None
    """Physical device id of each local rank as the launcher binds them (None: identity)."""
    description: str = ""
    source: str = field(default="<builtin>", compare=False)

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def devices_per_node(self) -> int:
        return math.prod(t.fanout for t in self.tiers)

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.nodes

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Every tier a collective can cross, innermost first; the network is last."""
        return tuple(t.name for t in self.tiers) + (self.network.name,)

    def with_nodes(self, nodes: int) -> Topology:
        nodes = number(
            nodes,
            integer=True,
            whole_floats=False,
            minimum=1,
            maximum=MAX_NODES,
            messages={
                **dict.fromkeys(
                    PROBLEMS, "node count must be a positive integer, got {found}; give --nodes 1 or more"
                ),
                "high": "node count {found} is above the limit of {maximum}",
            },
            error=lambda message: ConfigError(message, key="--nodes"),
        )
        return replace(self, nodes=nodes)

    def tier_size(self, tier: str) -> int:
        """Devices in one instance of ``tier`` (package: 2, node: 8, network: the world)."""
        size = 1
        for t in self.tiers:
            size *= t.fanout
            if t.name == tier:
                return size
        if tier == self.network.name:
            return self.world_size
        raise ConfigError(f"unknown tier {tier!r}; this topology has {', '.join(self.tier_names)}")

    def degree(self, spec: int | str) -> int:
        """Resolve a degree given as a number or a tier name (``package``, ``node``, ``world``)."""
        if isinstance(spec, bool):
            raise ConfigError(f"a degree must be a number or a tier name, got {spec!r}")
        if isinstance(spec, int):
            return spec
        if isinstance(spec, str):
            s = spec.strip().lower()
            if s.isdigit():
                return int(s)
            if s in DEVICE_NAMES:
                return 1
            if s in INNER_NAMES:
                return self.tiers[0].fanout
            if s in WORLD_NAMES or s == self.network.name:
                return self.world_size
            if s in (t.name for t in self.tiers):
                return self.tier_size(s)
        names = ", ".join(("device", "inner") + tuple(t.name for t in self.tiers) + ("world",))
        raise ConfigError(f"unknown degree {spec!r}: use a number or one of {names}")

    # -- tiers crossed ------------------------------------------------------------------------------
    def tier_of_group(self, topo_indices: Iterable[int]) -> str | None:
        """The outermost tier a group of topological indices spans (None for a single device)."""
        members = sorted(set(topo_indices))
        if len(members) <= 1:
            return None
        size = 1
        for t in self.tiers:
            size *= t.fanout
            if members[0] // size == members[-1] // size:
                return t.name
        return self.network.name

    def bandwidth_gbps(self, tier: str) -> float:
        """Per-device GB/s across ``tier`` when every device talks at once."""
        for t in self.tiers:
            if t.name == tier:
                return t.bandwidth_gbps
        if tier == self.network.name:
            return self.network.injection_gbps / self.devices_per_node
        raise ConfigError(f"unknown tier {tier!r}; this topology has {', '.join(self.tier_names)}")

    def latency_us(self, tier: str) -> float:
        for t in self.tiers:
            if t.name == tier:
                return t.latency_us
        if tier == self.network.name:
            return self.network.latency_us
        raise ConfigError(f"unknown tier {tier!r}; this topology has {', '.join(self.tier_names)}")

    # -- rank placement -----------------------------------------------------------------------------
    def topological_index(self, node_id: int, local_rank: int, physical_device: int | None = None) -> int:
        """Place a rank: ``physical_device`` (GCD/GPU id in the node) if known, else the device the
        launcher's ``device_order`` binds ``local_rank`` to, else ``local_rank`` itself."""
        dpn = self.devices_per_node
        if physical_device is not None:
            pos = physical_device
        elif self.device_order is not None and local_rank < len(self.device_order):
            pos = self.device_order[local_rank]
        else:
            pos = local_rank
        if not 0 <= pos < dpn:
            raise ConfigError(
                f"device position {pos} (node {node_id}, local rank {local_rank}) is outside the "
                f"{dpn} devices per node of topology {self.name!r}"
            )
        return node_id * dpn + pos

    def describe_tiers(self) -> list[tuple[str, int, float, float]]:
        """(tier name, devices per instance, GB/s per device, latency us) for every tier, inner first."""
        return [(n, self.tier_size(n), self.bandwidth_gbps(n), self.latency_us(n)) for n in self.tier_names]


# -- loading ----------------------------------------------------------------------------------------

_TOP_KEYS = {"name", "description", "device", "tiers", "network", "nodes", "device_order"}
_DEVICE_KEYS = {
    "name": str,
    "memory_gib": float,
    "peak_tflops": float,
    "quant_gbps": float,
    "host_reduce": bool,
    "memory_bandwidth_gbps": float,
    "comm_cpu_us_per_call": float,
    "comm_cpu_us_per_mb": float,
}
_DEVICE_OPTIONAL = (
    "quant_gbps",
    "host_reduce",
    "memory_bandwidth_gbps",
    "comm_cpu_us_per_call",
    "comm_cpu_us_per_mb",
)
_TIER_KEYS = {"name": str, "fanout": int, "bandwidth_gbps": float, "latency_us": float}
_NETWORK_KEYS = {"name": str, "injection_gbps": float, "latency_us": float}


def builtin_dir() -> Path:
    """Directory of the built-in topology files (inside the package when installed from a wheel)."""
    return resources.builtin_dir("topologies")


def builtin_topologies() -> list[str]:
    return resources.builtin_names("topologies")


def _typed(
    value: Any, kind: type, source: str, key: str, *, positive: bool = True, maximum: float | None = None
) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(
                f"expected true or false, found {short(value)} ({type(value).__name__})",
                source=source,
                key=key,
            )
        return value
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"expected a non-empty string, found {short(value)} ({type(value).__name__})",
                source=source,
                key=key,
            )
        if len(value.strip()) > MAX_NAME_CHARS:
            raise ConfigError(
                f"is {len(value)} characters long, more than {MAX_NAME_CHARS}; use a short name",
                source=source,
                key=key,
            )
        return value.strip()
    return number(
        value,
        integer=kind is int,
        above=0 if positive else None,
        minimum=None if positive else 0,
        maximum=maximum,
        messages={
            "type": f"expected a number, found {{found}} ({type(value).__name__})",
            "finite": "expected a finite number, found {found}",
            "whole": "expected a whole number, found {found}",
            "low": "expected a value {rule}, found {found}",
            "high": f"{{found}} is above the limit of {maximum or 0:g}; is it a typo?",
        },
        error=lambda message: ConfigError(message, source=source, key=key),
    )


def _section(raw: Any, spec: dict[str, type], source: str, path: str, optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"expected a mapping with keys {', '.join(spec)}, found {short(raw)}", source=source, key=path
        )
    unknown = sorted(map(str, set(raw) - set(spec)))
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}; expected one of {', '.join(spec)}",
            source=source,
            key=f"{path}.{unknown[0]}",
        )
    out = {}
    for k, kind in spec.items():
        if k not in raw:
            if k in optional:
                continue
            raise ConfigError(
                f"missing required key {k!r} ({kind.__name__})", source=source, key=f"{path}.{k}"
            )
        # Latency may be zero; every other number must be positive.
        maximum = MAX_FANOUT if k == "fanout" else _MAX_VALUE.get(k)
        out[k] = _typed(raw[k], kind, source, f"{path}.{k}", positive=(k != "latency_us"), maximum=maximum)
    return out


def topology_from_mapping(raw: Any, source: str = "<mapping>") -> Topology:
    """Build and validate a :class:`Topology` from parsed YAML; errors name ``source`` and the key path."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"a topology file must be a mapping, found {type(raw).__name__} (keys name, device, tiers, "
            "network; see topologies/*.yaml)",
            source=source,
        )
    unknown = sorted(map(str, set(raw) - _TOP_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key; expected one of {', '.join(sorted(_TOP_KEYS))}", source=source, key=unknown[0]
        )
    for k in ("name", "device", "tiers", "network"):
        if k not in raw:
            raise ConfigError(f"missing required key {k!r}", source=source, key=k)
    name = _typed(raw["name"], str, source, "name")
    device = Device(**_section(raw["device"], _DEVICE_KEYS, source, "device", optional=_DEVICE_OPTIONAL))
    tiers_raw = raw["tiers"]
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise ConfigError(
            f"expected a non-empty list of tiers (innermost first), found {short(tiers_raw)}",
            source=source,
            key="tiers",
        )
    if len(tiers_raw) > MAX_TIERS:
        raise ConfigError(
            f"{len(tiers_raw)} tiers; at most {MAX_TIERS} are supported", source=source, key="tiers"
        )
    tiers = tuple(Tier(**_section(t, _TIER_KEYS, source, f"tiers[{i}]")) for i, t in enumerate(tiers_raw))
    network = Network(**_section(raw["network"], _NETWORK_KEYS, source, "network"))
    names = [t.name for t in tiers] + [network.name]
    reserved = set(DEVICE_NAMES) | set(WORLD_NAMES) | set(INNER_NAMES)
    for i, n in enumerate(names):
        if n.lower() in reserved:
            raise ConfigError(
                f"tier name {n!r} is reserved ({', '.join(sorted(reserved))})",
                source=source,
                key=f"tiers[{i}].name" if i < len(tiers) else "network.name",
            )
        if names.count(n) > 1:
            raise ConfigError(
                f"tier name {n!r} is used twice; tier names must be unique", source=source, key="tiers"
            )
    nodes = _typed(raw.get("nodes", 1), int, source, "nodes", maximum=MAX_NODES)
    dpn = math.prod(t.fanout for t in tiers)
    if dpn > MAX_DEVICES_PER_NODE:
        fanouts = " x ".join(str(t.fanout) for t in tiers)
        raise ConfigError(
            f"the fan-outs {fanouts} make {dpn} devices per node, more than {MAX_DEVICES_PER_NODE}; check the fan-outs",
            source=source,
            key="tiers",
        )
    order = raw.get("device_order")
    if order is not None:
        if not isinstance(order, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in order):
            raise ConfigError(
                f"expected a list of device ids, found {short(order)}", source=source, key="device_order"
            )
        if sorted(order) != list(range(dpn)):
            fanouts = " x ".join(str(t.fanout) for t in tiers)
            raise ConfigError(
                f"must list each of the {dpn} devices per node (fan-outs {fanouts}) exactly once, found {short(order)}",
                source=source,
                key="device_order",
            )
        order = tuple(order)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"expected a string, found {short(description)}", source=source, key="description")
    return Topology(
        name=name,
        device=device,
        tiers=tiers,
        network=network,
        nodes=nodes,
        device_order=order,
        description=description.strip(),
        source=source,
    )


def load_topology(name_or_path: str | Path, nodes: int | None = None) -> Topology:
    """Load a built-in topology by name (``frontier``) or a YAML file by path; ``nodes`` overrides the
    file's node count."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        candidate = resources.builtin_file("topologies", str(name_or_path))
        if candidate is None:
            raise ConfigError(
                f"unknown topology {short(str(name_or_path))}: built-ins are {', '.join(builtin_topologies())}; "
                "or give the path of a YAML file (see docs/topology.md)"
            )
        path = candidate
    raw = load_yaml_file(
        path,
        what="topology file",
        hint=f"give a built-in topology ({', '.join(builtin_topologies())}) or a YAML file (docs/topology.md)",
    )
    topo = topology_from_mapping(raw, source=str(path))
    return topo.with_nodes(nodes) if nodes is not None else topo
