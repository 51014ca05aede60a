"""The MPI layout logic on a simulated multi-node world (threads standing in for ranks).

The real ``mpiexec`` tests run on one machine, where MPI sees one node; this drives
:func:`zerotopo.launch.mpi.world_from_comm` through communicators whose shared-memory split follows a
given host of every rank, including round-robin placements where a node's ranks are not consecutive.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from zerotopo.launch.mpi import world_from_comm

UNDEFINED = -32766
COMM_NULL = object()
FAKE_MPI = SimpleNamespace(COMM_TYPE_SHARED="shared", UNDEFINED=UNDEFINED, COMM_NULL=COMM_NULL)


class _Group:
    """Shared state of one communicator: its members (global ranks) and a slot per member."""

    def __init__(self, members: tuple[int, ...]):
        self.members = members
        self.slots: list = [None] * len(members)
        self.barrier = threading.Barrier(len(members))


class FakeComm:
    """Enough of an mpi4py communicator for world_from_comm, over threads."""

    def __init__(self, universe: dict, group: _Group, me: int):
        self.universe, self.group, self.me = universe, group, me

    def Get_rank(self) -> int:
        return self.group.members.index(self.me)

    def Get_size(self) -> int:
        return len(self.group.members)

    def allgather(self, value):
        self.group.slots[self.Get_rank()] = value
        self.group.barrier.wait()
        out = list(self.group.slots)
        self.group.barrier.wait()
        return out

    def bcast(self, value, root: int = 0):
        return self.allgather(value)[root]

    def Split(self, color, key: int = 0):
        entries = self.allgather((color, key, self.me))
        if color == UNDEFINED:
            return COMM_NULL
        members = tuple(m for _, _, m in sorted(e for e in entries if e[0] == color))
        with self.universe["lock"]:
            group = self.universe["groups"].setdefault(members, _Group(members))
        return FakeComm(self.universe, group, self.me)

    def Split_type(self, split_type, key: int = 0):
        assert split_type == "shared"
        return self.Split(self.universe["hosts"][self.me], key)

    def Free(self) -> None:
        pass


def run_world(hosts: list[str], environ: dict[str, str]) -> list:
    members = tuple(range(len(hosts)))
    universe = {"hosts": hosts, "lock": threading.Lock(), "groups": {}}
    world = _Group(members)
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = [
            pool.submit(world_from_comm, FakeComm(universe, world, r), FAKE_MPI, environ) for r in members
        ]
        return [f.result(timeout=30) for f in futures]


@pytest.mark.parametrize(
    ("hosts", "nodes", "locals_"),
    [
        (["a"] * 4 + ["b"] * 4, [0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 0, 1, 2, 3]),
        (["a", "a", "b", "b", "a", "a", "b", "b"], [0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 2, 3, 2, 3]),
        (["b", "a", "b", "a", "c", "c"], [0, 1, 0, 1, 2, 2], [0, 0, 1, 1, 0, 1]),
    ],
)
def test_world_layout(hosts, nodes, locals_):
    worlds = run_world(hosts, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4242"})
    assert [w.rank for w in worlds] == list(range(len(hosts)))
    assert [w.node_id for w in worlds] == nodes
    assert [w.local_rank for w in worlds] == locals_
    per_node = [hosts.count(h) for h in dict.fromkeys(hosts)]
    assert {(w.num_nodes, w.tasks_per_node, w.world_size) for w in worlds} == {
        (len(per_node), tuple(per_node), len(hosts))
    }
    assert all(w.local_world_size == hosts.count(hosts[w.rank]) for w in worlds)
    assert {(w.master_addr, w.master_port) for w in worlds} == {("10.0.0.1", 4242)}


def test_rank0_picks_and_broadcasts_port():
    worlds = run_world(["a"] * 4, {})
    assert len({(w.master_addr, w.master_port) for w in worlds}) == 1
    assert worlds[0].master_port > 0
