"""An emulated cluster network on one machine: one network namespace per node, joined by shaped links.

[Note: emulated network] Each emulated node gets its own network namespace with one interface on a
private bridge (in a namespace of its own, so nothing outside is touched); the node's egress is shaped
with ``tc`` (token bucket for the injection bandwidth, netem for the latency). Ranks of one node talk
over the namespace's loopback at memory speed, ranks of different nodes cross the shaped link, so the
inter-node tier is really the slow one, as on a bandwidth-starved cluster. Needs root (``ip netns``);
:func:`available` says whether it can run here. Addresses are taken from ``10.213.0.0/24`` and exist only
inside the namespaces created here; everything is torn down on exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from zerotopo.errors import ZerotopoError

SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


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
    """The namespaces of an emulated cluster: ``namespaces[i]`` holds node ``i`` at ``addresses[i]``."""

    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    rate_mbit: float
    delay_ms: float
    """One-way delay actually applied (0 where the kernel lacks the netem qdisc)."""


@contextlib.contextmanager
def emulated_network(nodes: int, *, rate_mbit: float, delay_ms: float = 0.0) -> Iterator[EmulatedNetwork]:
    """Create ``nodes`` namespaces joined by a bridge, each node's egress shaped to ``rate_mbit`` Mbit/s
    and ``delay_ms`` one-way delay; remove them all on exit (also on error)."""
    ok, why = available()
    if not ok:
        raise ZerotopoError(f"cannot emulate a network here: {why}")
    if not 1 <= nodes <= 200:
        raise ZerotopoError(f"emulated network: 1 to 200 nodes, got {nodes}")
    tag = uuid.uuid4().hex[:6]
    switch = f"zt{tag}sw"
    namespaces = tuple(f"zt{tag}n{i}" for i in range(nodes))
    addresses = tuple(f"{SUBNET}.{i + 1}" for i in range(nodes))
    created: list[str] = []
    try:
        _run("ip", "netns", "add", switch)
        created.append(switch)
        _run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(namespaces, addresses)):
            _run("ip", "netns", "add", ns)
            created.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # One veth pair per node: eth0 inside the node, p<i> on the switch's bridge.
            _run(
                "ip",
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"p{i}",
                "netns",
                switch,
            )
            _run("ip", "-n", switch, "link", "set", f"p{i}", "master", "br0")
            _run("ip", "-n", switch, "link", "set", f"p{i}", "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            qdisc = f"tc -n {ns} qdisc add dev eth0".split()
            parent = ["root"]
            if delay_ms > 0 and _try(*qdisc, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms"):
                parent = ["parent", "1:1"]
            elif delay_ms > 0:
                delay_ms = 0.0  # the kernel has no netem here: bandwidth is shaped, latency is not
            burst = max(int(rate_mbit * 1e6 / 8 / 250), 32 * 1024)  # ~4 ms of traffic
            tbf = f"handle 10: tbf rate {rate_mbit}mbit burst {burst} latency 400ms".split()
            _run(*qdisc, *parent, *tbf)
        yield EmulatedNetwork(namespaces, addresses, rate_mbit, delay_ms)
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def enter_namespace(name: str) -> None:
    """Move the calling process (before it opens any socket) into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ZerotopoError(f"setns into {name} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
