"""The per-node uplink layout of the emulated cluster: a node's ranks share one shaped inter-node class."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from zerotopo.launch.netem import available

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=f"emulated network unavailable: {why}")

SEND = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x' * 1000, ({!r}, 9)) for _ in range(200)]"


def _send(namespace: str, address: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", SEND.format(address)], check=True)


def _masters(switch: str) -> dict[str, str]:
    out = subprocess.run(["ip", "-n", switch, "-o", "link", "show"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\d+: ([^:@]+)[@:].* master (\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _drained(switch: str) -> int:
    """The uplink class's byte count once its queue has drained (two equal reads 0.1 s apart)."""
    from zerotopo.launch.netem import UPLINK_CLASS, class_bytes

    last = -1
    for _ in range(100):
        now = class_bytes("u0", switch).get(UPLINK_CLASS, 0)
        if now == last:
            return now
        last = now
        time.sleep(0.1)
    return last


def test_each_node_shares_one_shaped_uplink():
    from zerotopo.launch.netem import UPLINK_CLASS, class_bytes, emulated_cluster
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-frontier")  # 2 nodes x 4 ranks
    with emulated_cluster(topo, network_mbit=10, node_uplink=True) as net:
        masters = _masters(net.switch)
        shown = subprocess.run(["tc", "-n", net.switch, "class", "show", "dev", "u0"], capture_output=True,
                               text=True).stdout  # fmt: skip
        before = class_bytes("u0", net.switch).get(UPLINK_CLASS, 0)
        _send(net.namespaces[1], net.addresses[5])  # rank 1 (node 0) -> rank 5 (node 1)
        _send(net.namespaces[2], net.addresses[6])  # rank 2 (node 0) -> rank 6 (node 1)
        inter = _drained(net.switch) - before
        _send(net.namespaces[0], net.addresses[3])  # inside node 0: stays off the uplink
        intra = _drained(net.switch) - before - inter
        rank_classes = subprocess.run(["tc", "-n", net.namespaces[0], "class", "show", "dev", "eth0"],
                                      capture_output=True, text=True).stdout  # fmt: skip
    # ranks 0-3 hang off node 0's bridge, 4-7 off node 1's; each node bridge meets the core once
    assert {masters[f"p{r}"] for r in range(4)} == {"bn0"} and {masters[f"p{r}"] for r in range(4, 8)} == {
        "bn1"
    }
    assert masters["u0"] == "bn0" and masters["d0"] == "br0" and masters["d1"] == "br0"
    # one class at the node's rate: 4 ranks x 10 Mbit/s
    assert net.node_uplink_mbit == 40.0 and "rate 40Mbit" in shown
    # both ranks' traffic to the other node went through node 0's one class; of the 200 kB sent inside the
    # node none reaches the uplink (the bridges know every port: no flooding, no IPv6; at most a stray control frame)
    assert inter >= 2 * 200 * 1000 and intra < 2000
    # a rank's own classes keep the inner tiers' ratios; its network class is the node's rate
    assert "rate 160Mbit" in rank_classes and "rate 40Mbit" in rank_classes


CONNECT_ALL = """
import socket, sys
refused = 0
for addr in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((addr, 9))
    except ConnectionRefusedError:
        refused += 1
    except OSError as e:
        print(addr, e)
    finally:
        s.close()
print(refused)
"""


def test_full_mesh_above_the_hosts_arp_cap():
    """40 endpoints reach each other (1,560 neighbour pairs, over the kernel's host-wide default cap of
    1024 learned ARP entries): every endpoint knows every peer statically, so a connect to a closed port
    is refused by the peer instead of failing with "No route to host"."""
    from zerotopo.launch.netem import emulated_network

    with emulated_network(40, rate_mbit=100) as net:
        procs = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-c",
                    CONNECT_ALL,
                    *(a for a in net.addresses if a != own),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for ns, own in zip(net.namespaces, net.addresses)
        ]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        learned = subprocess.run(["ip", "-n", net.namespaces[0], "neigh", "show", "nud", "reachable"],
                                 capture_output=True, text=True).stdout  # fmt: skip
    assert all(out.strip().splitlines()[-1] == "39" for out in outs), outs[:3]
    assert learned.strip() == ""  # nothing was resolved by ARP
