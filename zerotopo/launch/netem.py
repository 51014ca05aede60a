"""An emulated cluster network on one machine: ranks in their own network namespaces, joined by shaped links.

[Note: emulated network] Every endpoint (a node, or a single rank) gets its own network namespace with
one interface ``eth0`` on a private bridge that lives in a namespace of its own, so nothing outside is
touched. Two layouts:

- :func:`emulated_network` — one namespace per *node*, its egress shaped by one token bucket: ranks of
  a node talk over the namespace's loopback at memory speed, only the inter-node tier is slow.
- :func:`emulated_cluster` — one namespace per *rank*, so every tier crosses a shaped link. Each rank's
  ``eth0`` has an ``htb`` qdisc with one class per tier (die, package, node, network ...) and a ``u32``
  filter per peer address that sends traffic for a peer into the class of the outermost tier the pair
  crosses. A pair of dies of one package gets the package rate, two ranks of different packages of one
  node the node rate, two nodes the network rate: the ratios of a real machine (Frontier: 200 : 50 :
  12.5 GB/s per GCD, 16 : 4 : 1), scaled to what this machine carries. The class counters
  (``tc -s class show``) count what really crossed each tier.

Needs root (``ip netns``) and ``tc``; :func:`available` says whether it can run here. Addresses are taken
from ``10.213.0.0/24`` and exist only inside the namespaces created here.

Teardown is robust: leaving the context (normally, on an error, on SIGINT, or on SIGTERM/SIGHUP, which
are turned into an exit while the network is up) kills every process still inside the namespaces and
every child process this launcher started, then deletes the namespaces. Names carry the launcher's pid
(``ztemu<pid>-<tag>-<i>``), so namespaces left by a launcher killed with SIGKILL are removed by the next
run (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import pid_alive

if TYPE_CHECKING:
    from zerotopo.placement.topology import Topology

SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000
PREFIX = "ztemu"
"""Every namespace created here is named ``ztemu<launcher pid>-<tag>-<role>``."""
NETNS_DIR = "/var/run/netns"
HOW_TO_SKIP = (
    "run as root with iproute2 (ip, tc) installed, or run without the emulated network "
    "(all ranks on this machine's loopback, tiers unshaped)"
)


def available() -> tuple[bool, str]:
    """(True, "") when namespaces and tc can be used here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "needs root for ip netns"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"the {tool!r} command is missing (apt-get install iproute2)"
    return True, ""


def _run(*cmd: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise ZerotopoError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()}")


def _try(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


@dataclass(frozen=True)
class EmulatedNetwork:
    """The namespaces of an emulated cluster: ``namespaces[i]`` holds endpoint ``i`` at ``addresses[i]``
    (a node for :func:`emulated_network`, a rank for :func:`emulated_cluster`)."""

    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    rate_mbit: float
    """The inter-node (network tier) rate, Mbit/s per endpoint."""
    delay_ms: float
    """One-way delay actually applied on the network tier (0 where the kernel lacks the netem qdisc)."""
    per_rank: bool = False
    """One namespace per rank (every tier shaped) rather than per node."""
    tier_rates_mbit: dict[str, float] = field(default_factory=dict)
    """Shaped rate of every tier, Mbit/s per rank (per-rank layout only)."""
    tier_classes: dict[str, str] = field(default_factory=dict)
    """htb class id of every tier on each rank's ``eth0`` (per-rank layout only)."""
    switch: str = ""
    """The namespace of the bridges (per-rank layout only)."""
    node_uplink_mbit: float | None = None
    """Rate of the one uplink every node's ranks share, Mbit/s (None: a network link per rank)."""

    def rank_namespaces(self, world_size: int, ranks_per_node: int | None) -> tuple[str, ...]:
        """The namespace of every rank of a job of ``world_size`` ranks, ``ranks_per_node`` per node."""
        per_node = ranks_per_node or world_size
        if self.per_rank:
            if len(self.namespaces) != world_size:
                raise ZerotopoError(
                    f"the emulated cluster has {len(self.namespaces)} rank namespaces, the job {world_size} "
                    "ranks; build it for the same topology and node count"
                )
            return self.namespaces
        if len(self.namespaces) * per_node != world_size:
            raise ZerotopoError(
                f"{world_size} ranks at {per_node} per node need {world_size // per_node} namespaces, the "
                f"emulated network has {len(self.namespaces)}"
            )
        return tuple(self.namespaces[r // per_node] for r in range(world_size))


# -- shaping of an emulated machine -----------------------------------------------------------------


def reference_ratios(topology: Topology) -> dict[str, float]:
    """Per-device bandwidth of every tier of ``topology`` relative to its network tier.

    Frontier's ratios (``topologies/frontier.yaml``: package 200, node 50, network 100/8 = 12.5 GB/s per
    GCD, i.e. 16 : 4 : 1) for every tier named as on Frontier, the topology's own ratios for the others.
    """
    from zerotopo.placement.topology import load_topology

    frontier = load_topology("frontier")
    f_net = frontier.bandwidth_gbps(frontier.network.name)
    own_net = topology.bandwidth_gbps(topology.network.name)
    out = {}
    for tier in topology.tier_names:
        if tier == topology.network.name:
            out[tier] = 1.0
        elif tier in frontier.tier_names[:-1]:
            out[tier] = frontier.bandwidth_gbps(tier) / f_net
        else:
            out[tier] = topology.bandwidth_gbps(tier) / own_net
    return out


def tier_rates(
    topology: Topology, network_mbit: float, overrides: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Mbit/s per rank of every tier: the network tier at ``network_mbit``, the others at
    :func:`reference_ratios` times that, ``overrides`` (tier -> Mbit/s) winning."""
    if network_mbit <= 0:
        raise ZerotopoError(f"the network rate must be > 0 Mbit/s, got {network_mbit}")
    rates = {t: r * network_mbit for t, r in reference_ratios(topology).items()}
    for tier, rate in (overrides or {}).items():
        if tier not in rates:
            raise ZerotopoError(
                f"cannot shape tier {tier!r}: topology {topology.name!r} has {', '.join(rates)}"
            )
        if rate <= 0:
            raise ZerotopoError(f"tier {tier!r}: the rate must be > 0 Mbit/s, got {rate}")
        rates[tier] = float(rate)
    return rates


def parse_rates(text: str) -> dict[str, float]:
    """``package=800,node=200`` -> {"package": 800.0, "node": 200.0} (Mbit/s per rank)."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ZerotopoError(
                f"--shape {text!r}: expected tier=Mbit/s pairs such as package=800,node=200,network=50"
            ) from None
    return out


def _burst(rate_mbit: float) -> int:
    # ~4 ms of traffic, never below one 64 KiB GSO segment (a smaller bucket throttles far below the rate)
    return max(int(rate_mbit * 1e6 / 8 / 250), 96 * 1024)


# -- namespaces and teardown ------------------------------------------------------------------------


def _netns_names() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def our_namespaces(pid: int | None = None) -> list[str]:
    """Namespaces created by this module (by launcher ``pid`` when given)."""
    head = f"{PREFIX}{pid}-" if pid is not None else PREFIX
    return [n for n in _netns_names() if n.startswith(head)]


def _namespace_pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def _kill(pids: list[int]) -> None:
    me = os.getpid()
    for pid in pids:
        if pid != me:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _delete(namespaces: list[str]) -> None:
    """Kill everything inside ``namespaces`` and delete them (a namespace with a live process in it
    stays alive after ``ip netns del``, so the processes go first)."""
    for ns in namespaces:
        _kill(_namespace_pids(ns))
    for ns in namespaces:
        for _ in range(50):
            if not _namespace_pids(ns):
                break
            time.sleep(0.02)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def remove_stale() -> list[str]:
    """Delete namespaces of launchers that no longer run (killed with SIGKILL); returns their names."""
    stale = []
    for ns in our_namespaces():
        m = re.match(rf"{PREFIX}(\d+)-", ns)
        if m and not pid_alive(int(m.group(1))):
            stale.append(ns)
    _delete(stale)
    return stale


def _kill_children() -> None:
    """Kill the rank processes this launcher started (some may not have entered a namespace yet)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.kill()
    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.join(timeout=5)


@contextlib.contextmanager
def _handling(sigs: tuple[int, ...], handler: Any) -> Iterator[None]:
    """``handler`` for ``sigs`` inside the block, the previous handlers after it (main thread only:
    elsewhere signals cannot be set, and the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _teardown_on_signals() -> contextlib.AbstractContextManager[None]:
    """While the network is up, SIGTERM and SIGHUP exit through Python (status 128 + signal) so the
    ``finally`` that tears it down runs; SIGINT already raises KeyboardInterrupt."""
    return _handling((signal.SIGTERM, signal.SIGHUP), _exit_on_signal)


def _shielded() -> contextlib.AbstractContextManager[None]:
    """Ignore SIGINT/SIGTERM/SIGHUP during teardown so a second signal cannot cut it short."""
    return _handling((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), signal.SIG_IGN)


@contextlib.contextmanager
def _ipv4_only(namespace: str) -> None:
    """No IPv6 in ``namespace``: its interfaces' autoconfiguration multicast would cross the bridges and
    the shaped classes, bytes the ranks never sent."""
    _run("ip", "netns", "exec", namespace, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
         "net.ipv6.conf.default.disable_ipv6=1")  # fmt: skip


@contextlib.contextmanager
def _namespaces(count: int, role: str) -> Iterator[tuple[str, tuple[str, ...], tuple[str, ...], list[str]]]:
    """A switch namespace with a bridge and ``count`` endpoint namespaces, each with ``eth0`` on the
    bridge at ``addresses[i]``; yields (switch, namespaces, addresses, MAC addresses); tears everything down on exit."""
    ok, why = available()
    if not ok:
        raise ZerotopoError(f"cannot emulate a network here: {why}; {HOW_TO_SKIP}")
    if not 1 <= count <= 250:
        raise ZerotopoError(f"emulated network: 1 to 250 endpoints, got {count}")
    remove_stale()
    tag = uuid.uuid4().hex[:6]
    base = f"{PREFIX}{os.getpid()}-{tag}-"
    switch = base + "sw"
    namespaces = tuple(f"{base}{role}{i}" for i in range(count))
    addresses = tuple(f"{SUBNET}.{i + 1}" for i in range(count))
    created: list[str] = []
    try:
        with _teardown_on_signals():
            _run("ip", "netns", "add", switch)
            created.append(switch)
            _ipv4_only(switch)
            _run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", switch, "link", "set", "br0", "up")
            for i, (ns, addr) in enumerate(zip(namespaces, addresses)):
                _run("ip", "netns", "add", ns)
                created.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _ipv4_only(ns)
                # One veth pair per endpoint: eth0 inside it, p<i> on the switch's bridge.
                _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}",
                     "netns", switch)  # fmt: skip
                _run("ip", "-n", switch, "link", "set", f"p{i}", "master", "br0")
                _run("ip", "-n", switch, "link", "set", f"p{i}", "up")
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
            macs = static_neighbours(namespaces, addresses)
            static_forwarding(switch, [(mac, f"p{i}") for i, mac in enumerate(macs)])
            yield switch, namespaces, addresses, macs
    finally:
        with _shielded():
            _kill_children()
            _delete(created[::-1])


def _mac(namespace: str, device: str = "eth0") -> str:
    res = subprocess.run(
        ["ip", "-n", namespace, "-o", "link", "show", device], capture_output=True, text=True
    )
    m = re.search(r"link/ether ([0-9a-f:]{17})", res.stdout)
    if res.returncode != 0 or m is None:
        raise ZerotopoError(
            f"emulated network: no MAC address for {device} in {namespace}: {res.stderr.strip()}"
        )
    return m.group(1)


def static_neighbours(namespaces: tuple[str, ...], addresses: tuple[str, ...]) -> list[str]:
    """Give every endpoint a permanent neighbour entry for every other endpoint, so that no ARP runs.

    The kernel's ARP table is one table for all network namespaces, and its learned entries are capped
    host-wide by ``net.ipv4.neigh.default.gc_thresh3`` (1024 by default): a full mesh of n endpoints
    learns n(n-1) entries, which overflows at 33 ranks ("neighbor table overflow", and a connect fails
    with "No route to host"). Permanent entries are exempt from that cap, and no ARP broadcast crosses
    the shaped links or their byte counters. Returns the endpoints' MAC addresses."""
    macs = [_mac(ns) for ns in namespaces]
    for ns, own in zip(namespaces, addresses):
        lines = "".join(
            f"neigh replace {addr} lladdr {mac} dev eth0 nud permanent\n"
            for addr, mac in zip(addresses, macs)
            if addr != own
        )
        res = subprocess.run(["ip", "-n", ns, "-batch", "-"], input=lines, capture_output=True, text=True)
        if res.returncode != 0:
            raise ZerotopoError(f"emulated network: static neighbours in {ns} failed: {res.stderr.strip()}")
    return macs


def static_forwarding(switch: str, entries: Iterable[tuple[str, str]]) -> None:
    """Tell the bridges of ``switch`` where every endpoint's MAC address is: (MAC, bridge port) pairs, the
    port naming its bridge.

    With static neighbours (:func:`static_neighbours`) an endpoint that only receives never sends a frame a
    bridge could learn its port from, and a bridge floods frames for an unlearned address to every port,
    the node uplinks included (bytes no real switch would carry); static entries forward them from the
    first frame."""
    lines = "".join(f"fdb replace {mac} dev {port} master static\n" for mac, port in entries)
    res = subprocess.run(["bridge", "-n", switch, "-batch", "-"], input=lines, capture_output=True, text=True)
    if res.returncode != 0:
        raise ZerotopoError(f"emulated network: static forwarding in {switch} failed: {res.stderr.strip()}")


@contextlib.contextmanager
def emulated_network(nodes: int, *, rate_mbit: float, delay_ms: float = 0.0) -> Iterator[EmulatedNetwork]:
    """Create ``nodes`` namespaces joined by a bridge, each node's egress shaped to ``rate_mbit`` Mbit/s
    and ``delay_ms`` one-way delay; remove them all on exit (also on error or signal)."""
    if not 1 <= nodes <= 200:
        raise ZerotopoError(f"emulated network: 1 to 200 nodes, got {nodes}")
    with _namespaces(nodes, "n") as (_, namespaces, addresses, _macs):
        for ns in namespaces:
            qdisc = f"tc -n {ns} qdisc add dev eth0".split()
            parent = ["root"]
            if delay_ms > 0 and _try(*qdisc, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms"):
                parent = ["parent", "1:1"]
            elif delay_ms > 0:
                delay_ms = 0.0  # the kernel has no netem here: bandwidth is shaped, latency is not
            tbf = f"handle 10: tbf rate {rate_mbit}mbit burst {_burst(rate_mbit)} latency 400ms".split()
            _run(*qdisc, *parent, *tbf)
        yield EmulatedNetwork(namespaces, addresses, rate_mbit, delay_ms)


@contextlib.contextmanager
def emulated_cluster(
    topology: Topology,
    *,
    network_mbit: float = 50.0,
    rates: Mapping[str, float] | None = None,
    delays_ms: Mapping[str, float] | None = None,
    node_uplink: bool = False,
) -> Iterator[EmulatedNetwork]:
    """One namespace per rank of ``topology`` (rank = topological index), every tier shaped.

    ``node_uplink``: the ranks of a node share one uplink, as a Frontier node's GCDs share its NICs:
    each node's ranks sit on a bridge of their own, joined to the core bridge by one veth pair whose
    egress is the node's only shaped inter-node class (``network_mbit`` times the ranks per node). A
    rank's own network class then runs at that node rate (it counts bytes, the uplink shapes them);
    inner tiers keep their per-rank classes. False: every rank has its own network link.

    ``network_mbit``: the network tier's rate per rank; the inner tiers run at Frontier's ratios above
    it (:func:`tier_rates`), ``rates`` (tier -> Mbit/s) overriding any of them. ``delays_ms`` (tier ->
    ms) adds a netem delay to a tier's class where the kernel has netem. Traffic to a peer goes into the
    class of the outermost tier the pair crosses (``Topology.tier_of_group``).
    """
    shaped = tier_rates(topology, network_mbit, rates)
    world = topology.world_size
    classes = {tier: f"1:{10 * (i + 1)}" for i, tier in enumerate(topology.tier_names)}
    net_tier = topology.network.name
    delays = dict(delays_ms or {})
    per_node = topology.devices_per_node
    rank_rates = dict(shaped)
    if node_uplink:
        rank_rates[net_tier] = shaped[net_tier] * per_node
    with _namespaces(world, "r") as (switch, namespaces, addresses, macs):
        if node_uplink:
            node_uplinks(switch, per_node, rank_rates[net_tier], macs)
        applied: dict[str, float] = {}
        for rank, ns in enumerate(namespaces):
            tc = ("tc", "-n", ns)
            default = classes[net_tier].split(":")[1]
            _run(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", default)
            for tier, cls in classes.items():
                rate = rank_rates[tier]
                burst = _burst(rate)
                _run(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb",
                     "rate", f"{rate:g}mbit", "ceil", f"{rate:g}mbit", "burst", str(burst),
                     "cburst", str(burst), "quantum", "60000")  # fmt: skip
                delay = delays.get(tier, 0.0)
                leaf = ("qdisc", "add", "dev", "eth0", "parent", cls, "handle", f"{cls.split(':')[1]}:")
                if delay > 0 and _try(*tc, *leaf, "netem", "delay", f"{delay}ms", "limit", "100000"):
                    applied[tier] = delay
            for peer, addr in enumerate(addresses):
                if peer == rank:
                    continue
                tier = topology.tier_of_group((rank, peer)) or net_tier
                _run(*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "dst", f"{addr}/32", "flowid", classes[tier])  # fmt: skip
        yield EmulatedNetwork(
            namespaces,
            addresses,
            shaped[net_tier],
            applied.get(net_tier, 0.0),
            per_rank=True,
            tier_rates_mbit=shaped,
            tier_classes=classes,
            switch=switch,
            node_uplink_mbit=rank_rates[net_tier] if node_uplink else None,
        )


UPLINK_CLASS = "1:10"
"""htb class of a node's uplink on its ``u<node>`` port (:func:`node_uplinks`)."""


def node_uplinks(switch: str, per_node: int, rate_mbit: float, macs: list[str]) -> None:
    """Move the ports of every node's ranks on ``switch`` (``p<rank>``, see :func:`_namespaces`) to a
    bridge ``bn<node>`` of the node's own, joined to the core bridge ``br0`` by one veth pair
    ``u<node>`` - ``d<node>``; ``u<node>``'s egress (everything the node sends to other nodes) is one htb
    class at ``rate_mbit``. ``macs``: the ranks' MAC addresses, placed statically on every bridge
    (:func:`static_forwarding`)."""
    tc = ("tc", "-n", switch)
    burst = str(_burst(rate_mbit))
    world = len(macs)
    for node in range(world // per_node):
        bridge, up, down = f"bn{node}", f"u{node}", f"d{node}"
        _run("ip", "-n", switch, "link", "add", bridge, "type", "bridge")
        _run("ip", "-n", switch, "link", "set", bridge, "up")
        _run("ip", "-n", switch, "link", "add", up, "type", "veth", "peer", "name", down)
        _run("ip", "-n", switch, "link", "set", up, "master", bridge)
        _run("ip", "-n", switch, "link", "set", down, "master", "br0")
        for dev in (up, down):
            _run("ip", "-n", switch, "link", "set", dev, "up")
        for rank in range(node * per_node, (node + 1) * per_node):
            _run("ip", "-n", switch, "link", "set", f"p{rank}", "master", bridge)
        _run(*tc, "qdisc", "add", "dev", up, "root", "handle", "1:", "htb", "default", "10")
        _run(*tc, "class", "add", "dev", up, "parent", "1:", "classid", UPLINK_CLASS, "htb",
             "rate", f"{rate_mbit:g}mbit", "ceil", f"{rate_mbit:g}mbit", "burst", burst, "cburst", burst,
             "quantum", "60000")  # fmt: skip
    static_forwarding(
        switch,
        [(mac, f"d{rank // per_node}") for rank, mac in enumerate(macs)]
        + [
            (mac, f"p{rank}" if rank // per_node == node else f"u{node}")
            for node in range(world // per_node)
            for rank, mac in enumerate(macs)
        ],
    )


# -- inside a rank ----------------------------------------------------------------------------------


def enter_namespace(name: str) -> None:
    """Move the calling process (before it opens any socket) into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"{NETNS_DIR}/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ZerotopoError(f"setns into {name} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def class_bytes(device: str = "eth0", namespace: str | None = None) -> dict[str, int]:
    """Bytes sent so far through every htb class of ``device`` (class id -> bytes), in the caller's
    network namespace or in ``namespace``; {} when the device has no htb classes."""
    return {cls: sent for cls, (sent, _) in class_counters(device, namespace).items()}


def class_counters(device: str = "eth0", namespace: str | None = None) -> dict[str, tuple[int, int]]:
    """Bytes and packets sent so far through every htb class of ``device`` (class id -> (bytes,
    packets), a segmentation-offloaded packet counted as its segments, each with its headers), as
    :func:`class_bytes`."""
    cmd = ["tc"] + (["-n", namespace] if namespace else []) + ["-s", "class", "show", "dev", device]
    res = subprocess.run(cmd, capture_output=True, text=True)
    out: dict[str, tuple[int, int]] = {}
    current = None
    for line in res.stdout.splitlines():
        m = re.match(r"class htb (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*Sent (\d+) bytes (\d+) pkt", line)
        if m and current is not None:
            out[current] = (int(m.group(1)), int(m.group(2)))
            current = None
    return out
