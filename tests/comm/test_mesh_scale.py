"""Mesh start-up at 4,096 ranks (Frontier, 512 nodes, closest binding) with a fake process-group factory.

No process group is made: ``torch.distributed``'s entry points are replaced by fakes that record every
call, so one process can play any rank of a large job and count what that rank would create.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from zerotopo.comm import mesh as mesh_mod
from zerotopo.comm.mesh import MESH_KINDS, RankPlacement, build_mesh
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology

NODES = 512


class FakeDist:
    """Stands in for one rank of a ``world``-rank job: every rank lives on its own topology node host,
    and the launcher's rank order is the closest binding's (local rank k drives GCD order[k])."""

    def __init__(self, topology: Any, rank: int) -> None:
        self.topology, self.rank = topology, rank
        self.world = topology.world_size
        self.calls: list[tuple[tuple[int, ...], dict[str, Any]]] = []
        self.gathers = 0

    def topo_index(self, rank: int) -> int:
        dpn = self.topology.devices_per_node
        node, local = divmod(rank, dpn)
        return node * dpn + self.topology.device_order[local]

    def all_gather_object(self, out: list, obj: Any) -> None:
        self.gathers += 1
        dpn = self.topology.devices_per_node
        for r in range(self.world):
            t = self.topo_index(r)
            out[r] = RankPlacement(r, t, f"node{t // dpn}", t // dpn, t % dpn, obj.pg_count)

    def new_group(
        self, ranks: list[int], *, use_local_synchronization: bool = False, sort_ranks: bool = True
    ) -> str:
        """torch's signature (the parts the mesh uses)."""
        kwargs = {"use_local_synchronization": use_local_synchronization, "sort_ranks": sort_ranks}
        self.calls.append((tuple(ranks), kwargs))
        return f"pg{len(self.calls)}"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    topology = load_topology("frontier", nodes=NODES)

    def install(rank: int) -> FakeDist:
        f = FakeDist(topology, rank)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: f.rank)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: f.world)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
        monkeypatch.setattr(dist, "all_gather_object", f.all_gather_object)
        monkeypatch.setattr(dist, "new_group", f.new_group)
        return f

    return topology, install


@pytest.mark.parametrize("preset", ["zerotopo", "zero3", "zeropp", "hsdp"])
def test_mesh_at_4096_ranks_creates_only_its_own_groups(fake, preset: str) -> None:
    topology, install = fake
    plan = get_preset(preset)
    assert topology.world_size == 4096
    for rank in (0, 1, 2049, 4095):
        f = install(rank)
        t = f.topo_index(rank)
        mesh = build_mesh(topology, plan, topo_index=t)
        assert f.gathers == 1
        kinds = [k for k in MESH_KINDS if k != "secondary" or plan.degrees(topology).secondary is not None]
        assert set(mesh.kinds) == set(kinds)
        # One group per distinct member set this rank belongs to, created by its members only, in the
        # given (topological) order: never a call per member set of the whole job.
        distinct = {mesh.group(k).ranks for k in mesh.kinds if mesh.group(k).size > 1}
        assert len(f.calls) == len(distinct) <= len(MESH_KINDS)
        assert {ranks for ranks, _ in f.calls} == distinct
        for ranks, kwargs in f.calls:
            assert rank in ranks
            assert kwargs.get("use_local_synchronization") is True
            assert kwargs["sort_ranks"] is False
        for k in mesh.kinds:
            g = mesh.group(k)
            assert [f.topo_index(r) for r in g.ranks] == sorted(f.topo_index(r) for r in g.ranks)
            assert g.ranks[g.position] == rank
            assert g.in_order, k  # no collective on it permutes
        # The whole job is one group too, numbered topologically (the launcher's order is not).
        assert mesh.group("world").ranks != tuple(range(4096))


def test_mesh_without_sort_ranks_precomputes_permutations(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without ``new_group(sort_ranks=...)`` numbers groups by sorted rank: the handles say so,
    and the collectives' index tensors are made once per group, not per call."""
    topology, install = fake
    f = install(5)
    monkeypatch.setattr(mesh_mod, "_sort_ranks_supported", lambda: False)
    mesh = build_mesh(topology, get_preset("zerotopo"), topo_index=f.topo_index(5))
    for ranks, _ in f.calls:
        assert list(ranks) == sorted(ranks)
    g = mesh.group("params")  # ranks 4 and 5 drive GCDs 6 and 7 ... a permuted node
    node = mesh.group("grads")
    assert not node.in_order and sorted(node.pg_ranks) == list(range(node.size))
    assert [node.ranks[p] for p in node.position_of_pg_rank] == sorted(node.ranks)
    idx = node.index(node.pg_ranks, "cpu")
    assert idx.tolist() == list(node.pg_ranks) and node.index(node.pg_ranks, "cpu") is idx
    assert g.size == 2


def test_mesh_falls_back_to_every_rank_creating_every_group(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the ranks do not agree on how many groups they already have (torch hashes that count into a
    locally created group's name), every rank creates every group instead, in the same order."""
    topology, install = fake
    f = install(0)
    gather = f.all_gather_object

    def uneven(out: list, obj: Any) -> None:
        gather(out, obj)
        out[1] = RankPlacement(
            *[getattr(out[1], k) for k in ("rank", "topo_index", "hostname", "node")], 0, 99
        )

    monkeypatch.setattr(dist, "all_gather_object", uneven)
    mesh = build_mesh(topology, get_preset("hsdp"), topo_index=f.topo_index(0))
    assert all(kwargs["use_local_synchronization"] is False for _, kwargs in f.calls)
    created = {ranks for ranks, _ in f.calls}
    assert len(created) == len(f.calls)  # each member set once
    assert mesh.group("params").ranks in created and len(f.calls) > 4096 // 8  # groups of other ranks too
