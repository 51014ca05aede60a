"""The all-to-all with a count per pair (zerotopo/comm/collectives.py, ``all_to_all_uneven``) on 8 gloo
ranks: every group of the zerotopo mesh, with the launcher's rank order permuted and the groups numbered
by sorted rank (so some groups take the path that reorders chunks into torch's numbering), each pair
moving exactly its elements, fp32 and bf16 (natively and through the byte fallback), recorded in the
ledger as the elements that leave the rank."""

from __future__ import annotations

import pytest
import torch

from zerotopo.comm import collectives as C
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import build_mesh
from zerotopo.launch.spawn import spawn
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology

pytestmark = pytest.mark.slow

CLOSEST4 = (2, 3, 0, 1)


def count(src: int, dst: int) -> int:
    """Elements position ``src`` sends to position ``dst``: uneven, some pairs none."""
    return (3 * src + dst) % 4


def payload(src: int, dst: int) -> torch.Tensor:
    """Values that name the pair and the index, exact in bf16 (integers below 256)."""
    return torch.arange(count(src, dst), dtype=torch.float32) + 16 * src + 4 * dst


def _worker(rank: int, world: int) -> dict:
    from zerotopo.comm import mesh as mesh_mod

    mesh_mod._sort_ranks_supported = lambda: False  # groups numbered by sorted rank
    index = (rank // 4) * 4 + CLOSEST4[rank % 4]
    mesh = build_mesh(load_topology("emulated"), get_preset("zerotopo"), topo_index=index)
    ledger = Ledger()
    out: dict = {"in_order": {}, "ok": {}, "bytes": {}, "expected_bytes": {}}
    for kind in mesh.kinds:
        g = mesh.group(kind)
        me, d = g.position, g.size
        ins = [count(me, j) for j in range(d)]
        outs = [count(j, me) for j in range(d)]
        expected = torch.cat([payload(j, me) for j in range(d)])
        for dtype in (torch.float32, torch.bfloat16):
            inp = torch.cat([payload(me, j) for j in range(d)]).to(dtype)
            recv = torch.full((sum(outs),), -1.0, dtype=dtype)
            ledger.reset()
            C.all_to_all_uneven(recv, inp, outs, ins, g, ledger=ledger, tag=kind)
            out["ok"][(kind, str(dtype))] = torch.equal(recv.float(), expected)
            out["bytes"][(kind, str(dtype))] = sum(r.bytes_sent for r in ledger.records())
            out["expected_bytes"][(kind, str(dtype))] = (
                sum(ins[j] for j in range(d) if j != me) * inp.element_size()
            )
        out["in_order"][kind] = g.in_order
    g = mesh.group("world")
    mesh.comm.assume_unsupported("gloo", "all_to_all", torch.bfloat16)
    me = g.position
    inp = torch.cat([payload(me, j) for j in range(g.size)]).bfloat16()
    recv = torch.empty(sum(count(j, me) for j in range(g.size)), dtype=torch.bfloat16)
    C.all_to_all_uneven(
        recv, inp, [count(j, me) for j in range(g.size)], [count(me, j) for j in range(g.size)], g
    )
    out["fallback"] = torch.equal(recv.float(), torch.cat([payload(j, me) for j in range(g.size)]))
    mesh.comm.clear_unsupported()
    errors = []
    for bad in ([1] * (g.size - 1), [-1] + [0] * (g.size - 1)):
        try:
            C.all_to_all_uneven(torch.empty(0), torch.empty(0), bad, bad, g)
        except ValueError as exc:
            errors.append(str(exc))
    try:
        C.all_to_all_uneven(torch.empty(3), torch.empty(2), [0] * g.size, [0] * g.size, g)
    except ValueError as exc:
        errors.append(str(exc))
    out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 8, ranks_per_node=4, timeout_s=600)


def test_each_pair_receives_exactly_its_elements_in_position_order(results):
    for r in results:
        assert r["ok"] and all(r["ok"].values()), r["ok"]
        assert r["fallback"]
    # both paths ran: groups torch numbers by position and groups it numbers otherwise
    orders = {v for r in results for v in r["in_order"].values()}
    assert orders == {True, False}


def test_the_ledger_records_the_elements_that_leave_the_rank(results):
    for r in results:
        assert r["bytes"] == r["expected_bytes"]
    assert any(v > 0 for r in results for v in r["bytes"].values())


def test_counts_that_do_not_fit_the_group_or_the_buffers_are_refused_naming_them(results):
    errors = results[0]["errors"]
    assert len(errors) == 3
    assert "one non-negative count per position of a group of 8" in errors[0]
    assert "one non-negative count per position" in errors[1]
    assert "input (2 torch.float32) and output (3 torch.float32)" in errors[2]
