"""Mesh groups and the plain collectives on 8 gloo ranks (2 nodes x 2 packages x 2 dies).

Each spawn runs many checks, since starting 8 ranks costs seconds on this machine.
"""

from __future__ import annotations

import pytest
import torch

from zerotopo.comm import collectives as C
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import MESH_KINDS, build_mesh
from zerotopo.errors import LaunchError
from zerotopo.launch.spawn import spawn
from zerotopo.placement import layout, volume
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology

pytestmark = pytest.mark.slow

# Frontier's closest binding: local rank k drives device CLOSEST[k] (here for 4 devices per node).
CLOSEST4 = (2, 3, 0, 1)


def _topo_index(rank: int, permuted: bool) -> int:
    node, local = divmod(rank, 4)
    return node * 4 + (CLOSEST4[local] if permuted else local)


def _data(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(n, generator=g).to(dtype)


def _mesh_rank(rank: int, world: int, permuted: bool, sorted_groups: bool = False) -> dict:
    if sorted_groups:
        # A torch without new_group(sort_ranks=False): groups numbered by sorted rank, permuting path.
        from zerotopo.comm import mesh as mesh_mod

        mesh_mod._sort_ranks_supported = lambda: False
    topo = load_topology("emulated")
    out: dict = {"groups": {}, "bytes": {}}
    for preset in ("zerotopo", "zero3", "zerotopo-pkg"):
        mesh = build_mesh(topo, get_preset(preset), topo_index=_topo_index(rank, permuted))
        out["groups"][preset] = {
            k: (mesh.group(k).ranks, mesh.group(k).position, mesh.group(k).tier) for k in mesh.kinds
        }
        out["rank_of_index"] = mesh.rank_of_index
    out["describe"] = mesh.describe()
    mesh = build_mesh(topo, get_preset("zerotopo"), topo_index=_topo_index(rank, permuted))
    out["in_order"] = {k: mesh.group(k).in_order for k in mesh.kinds}
    out["device_mesh"] = _device_mesh_checks(rank, mesh)
    ledger = Ledger()
    d = mesh.degrees
    checks = {}
    for kind in ("params", "grads", "world", "grad_replicas", "optim_scatter"):
        g = mesh.group(kind)
        # all_gather: position order, whatever the rank order.
        shard = _data(rank, 6, torch.bfloat16)
        full = torch.empty(6 * g.size, dtype=torch.bfloat16)
        C.all_gather(full, shard, g, ledger=ledger, tag=kind)
        ref = torch.cat([_data(r, 6, torch.bfloat16) for r in g.ranks])
        checks[f"ag {kind}"] = torch.equal(full, ref)
        # reduce_scatter with the layout's order (a grads group) or identity.
        order = layout.reduce_scatter_order(d) if kind == "grads" else None
        inp = _data(rank, 4 * g.size)
        shard_out = torch.empty(4)
        pending = C.reduce_scatter(shard_out, inp, g, order=order, ledger=ledger, async_op=True, tag=kind)
        pending.wait()
        pending.wait()  # idempotent
        total = sum(_data(r, 4 * g.size) for r in g.ranks)
        chunk = (order or list(range(g.size)))[g.position]
        checks[f"rs {kind}"] = torch.allclose(shard_out, total.view(g.size, 4)[chunk], atol=1e-5)
        # all_reduce sum and max
        t = _data(rank, 5)
        C.all_reduce(t, g, ledger=ledger)
        checks[f"ar {kind}"] = torch.allclose(t, sum(_data(r, 5) for r in g.ranks), atol=1e-5)
        t = _data(rank, 3)
        C.all_reduce(t, g, op="max", ledger=ledger)
        checks[f"armax {kind}"] = torch.equal(t, torch.stack([_data(r, 3) for r in g.ranks]).amax(0))
        # all_to_all: chunk j of position i's input lands at chunk i of position j's output.
        inp = _data(rank, 2 * g.size)
        a2a = torch.empty_like(inp)
        C.all_to_all(a2a, inp, g, ledger=ledger)
        ref = torch.cat([_data(r, 2 * g.size).view(g.size, 2)[g.position] for r in g.ranks])
        checks[f"a2a {kind}"] = torch.equal(a2a, ref)
        # broadcast from the last position
        t = _data(rank, 3, torch.float16)
        C.broadcast(t, g.size - 1, g, ledger=ledger)
        checks[f"bc {kind}"] = torch.equal(t, _data(g.ranks[-1], 3, torch.float16))
    out["checks"] = checks
    out["records"] = [
        (r.op, r.kind, r.size, r.tier, r.dtype, r.numel, r.bytes_sent) for r in ledger.records()
    ]
    out["summary"] = ledger.mark_step()
    out["by_tier"] = ledger.bytes_by_tier()
    # The gloo fallbacks must give the same results.
    mesh.comm.assume_unsupported("gloo", "reduce_scatter")
    mesh.comm.assume_unsupported("gloo", "all_gather", torch.bfloat16)
    mesh.comm.assume_unsupported("gloo", "all_reduce", torch.bfloat16)
    g = mesh.group("grads")
    order = layout.reduce_scatter_order(d)
    inp = _data(rank, 4 * g.size, torch.bfloat16)
    shard_out = torch.empty(4, dtype=torch.bfloat16)
    C.reduce_scatter(shard_out, inp, g, order=order, ledger=ledger)
    total = sum(_data(r, 4 * g.size, torch.bfloat16).float() for r in g.ranks)
    checks["rs fallback"] = torch.allclose(
        shard_out.float(), total.view(g.size, 4)[order[g.position]], atol=0.05
    )
    full = torch.empty(3 * g.size, dtype=torch.bfloat16)
    C.all_gather(full, _data(rank, 3, torch.bfloat16), g)
    checks["ag fallback"] = torch.equal(full, torch.cat([_data(r, 3, torch.bfloat16) for r in g.ranks]))
    t = _data(rank, 5, torch.bfloat16)
    C.all_reduce(t, g)
    checks["ar fallback"] = torch.allclose(
        t.float(), sum(_data(r, 5, torch.bfloat16).float() for r in g.ranks), atol=0.05
    )
    out["fallback_record"] = ledger.records()[-1].bytes_sent
    mesh.comm.clear_unsupported()
    return out


def _device_mesh_checks(rank: int, mesh) -> dict:
    """The job as torch's DeviceMesh over the engine's groups: a DTensor sharded along each dim gathers
    in topological position order, through the very process groups the engine's collectives use."""
    from torch.distributed.tensor import DTensor, Shard

    try:
        dm = mesh.device_mesh
    except LaunchError as exc:
        return {"error": str(exc)}
    names = dm.mesh_dim_names
    out = {
        "names": names,
        "grid": dm.mesh.tolist(),
        "coordinate": {n: dm.get_local_rank(n) for n in names},
        "same_groups": all(dm.get_group(n) is mesh.group(n).pg for n in names),
        "gathered": {},
    }
    for n in (*names, "params"):
        sub = dm[n] if n in names else mesh.device_mesh_of(n)
        full = DTensor.from_local(torch.full((2,), float(rank)), sub, [Shard(0)]).full_tensor()
        out["gathered"][n] = full.tolist()
    return out


@pytest.mark.parametrize(
    ("permuted", "sorted_groups"),
    [(False, False), (True, False), (True, True)],
    ids=["identity", "closest-binding", "closest-binding-sorted-groups"],
)
def test_mesh_groups_and_collectives(permuted: bool, sorted_groups: bool) -> None:
    topo = load_topology("emulated")
    results = spawn(_mesh_rank, 8, args=(permuted, sorted_groups), ranks_per_node=4, timeout_s=180)
    rank_of_index = tuple(r for r in results[0]["rank_of_index"])
    assert all(_topo_index(rank_of_index[t], permuted) == t for t in range(8))
    for rank, res in enumerate(results):
        t = _topo_index(rank, permuted)
        for preset, groups in res["groups"].items():
            d = get_preset(preset).degrees(topo)
            assert set(groups) == {k for k in MESH_KINDS if k != "secondary" or d.secondary is not None}
            for kind in layout.GROUP_KINDS:
                if kind == "secondary" and d.secondary is None:
                    continue
                members = layout.group_of(t, d, kind)
                ranks, position, tier = groups[kind]
                assert ranks == tuple(rank_of_index[i] for i in members), (preset, kind)
                assert position == members.index(t)
                assert tier == topo.tier_of_group(members)
            assert groups["world"][0] == tuple(rank_of_index)
        # Groups numbered by position: no collective permutes (unless torch sorted them).
        in_order = res["in_order"]
        if sorted_groups:
            assert not in_order["world"] and not in_order["grads"]
        else:
            assert all(in_order.values()), in_order
        # torch's DeviceMesh over the same groups: coordinates are positions, the grid is topological.
        dm = res["device_mesh"]
        if sorted_groups:
            assert "sort_ranks" in dm["error"] and "topological order" in dm["error"]
        else:
            zt = get_preset("zerotopo").degrees(topo)  # o = 8 (the job), g = 4 (a node): no optim_replicas
            assert dm["names"] == ("optim_scatter", "grads") and dm["same_groups"]
            assert dm["grid"] == [list(rank_of_index[:4]), list(rank_of_index[4:])]
            assert dm["coordinate"] == {"optim_scatter": t // zt.grads, "grads": t % zt.grads}
            for kind, full in dm["gathered"].items():
                members = layout.group_of(t, zt, kind)
                assert full == [float(rank_of_index[i]) for i in members for _ in range(2)], kind
        failed = [k for k, ok in res["checks"].items() if not ok]
        assert not failed, f"rank {rank}: {failed}"
        # zerotopo on emulated: grads = node (4 ranks, tier node), params = package, world crosses the network.
        zt = res["groups"]["zerotopo"]
        assert zt["params"][2] == "package" and zt["grads"][2] == "node" and zt["world"][2] == "network"
        assert len(zt["grads_intra"][0]) == 4 and len(zt["grads_inter"][0]) == 1
        z3 = res["groups"]["zero3"]
        assert len(z3["grads_intra"][0]) == 4 and len(z3["grads_inter"][0]) == 2
        assert z3["grads_inter"][2] == "network" and z3["grads_intra"][2] == "node"
        # Ledger: each record's bytes are volume.py's figure for that op.
        figures = {
            "all_gather": lambda n, d, e: volume.all_gather_bytes(n, d, e),
            "reduce_scatter": volume.reduce_scatter_bytes,
            "all_reduce": volume.all_reduce_bytes,
            "all_to_all": volume.all_to_all_bytes,
        }
        elem = {"float32": 4, "bfloat16": 2, "float16": 2}
        for op, kind, size, tier, dtype, numel, nbytes in res["records"]:
            if op == "broadcast":
                root = kind and res["groups"]["zerotopo"][kind][1] == size - 1
                assert nbytes == volume.broadcast_bytes(numel, size, elem[dtype], is_root=root)
            else:
                assert nbytes == figures[op](numel, size, elem[dtype]) > 0
            assert tier == res["groups"]["zerotopo"][kind][2]
        by_tier = res["by_tier"]
        assert set(by_tier) == {"package", "node", "network"}
        assert sum(by_tier.values()) == res["summary"]["bytes"] == sum(r[-1] for r in res["records"])
        assert res["fallback_record"] == volume.all_reduce_bytes(5, 4, 2)
    assert "grads" in results[0]["describe"]


def _startup_errors(rank: int, world: int) -> list[str]:
    """Three wrong launches in one spawn; each must raise on every rank (none may hang)."""
    zero3 = get_preset("zero3")
    attempts = [
        # 4 ranks, but the emulated topology has 2 nodes of 4.
        lambda: build_mesh(load_topology("emulated"), zero3, topo_index=rank),
        # Ranks 1 and 2 both claim index 1.
        lambda: build_mesh(
            load_topology("emulated", nodes=1), zero3, topo_index=min(rank, 1) if rank < 3 else 3
        ),
        # Rank 3 claims another host than the rest of its (topological) node.
        lambda: build_mesh(
            load_topology("emulated", nodes=1),
            zero3,
            topo_index=rank,
            hostname="nodeB" if rank == 3 else "nodeA",
        ),
    ]
    out = []
    for attempt in attempts:
        try:
            attempt()
            out.append("no error")
        except LaunchError as exc:
            out.append(str(exc))
    return out


def test_startup_checks() -> None:
    for world_msg, dup_msg, host_msg in spawn(_startup_errors, 4, ranks_per_node=4, timeout_s=120):
        assert "4 ranks" in world_msg and "2 nodes x 4 devices = 8" in world_msg, world_msg
        assert "index 1 claimed by ranks [1, 2]" in dup_msg and "no rank has index [2]" in dup_msg, dup_msg
        assert "spans several hosts" in host_msg and "ranks [3] on 'nodeB'" in host_msg, host_msg
