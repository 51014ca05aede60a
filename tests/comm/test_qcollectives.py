"""Quantized collectives on 4 and 8 gloo ranks against single-process reference math and the
quantization error bound."""

from __future__ import annotations

import pytest
import torch

from zerotopo.comm import collectives
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import build_mesh
from zerotopo.comm.qcollectives import all_gather_int8, gather_quantized, reduce_scatter_int4
from zerotopo.comm.quant import dequantize, quantize_int4, quantize_int8
from zerotopo.launch.spawn import spawn
from zerotopo.placement import layout, volume
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology

pytestmark = pytest.mark.slow

CLOSEST4 = (2, 3, 0, 1)
SLACK = 1e-5


def _topo_index(rank: int, permuted: bool) -> int:
    node, local = divmod(rank, 4)
    return node * 4 + (CLOSEST4[local] if permuted else local)


def _data(rank: int, n: int, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * salt + rank)
    # Different magnitudes per rank, so per-block scales differ.
    return (torch.randn(n, generator=g) * (1 + rank)).to(dtype)


def _scale_per_element(q, n: int) -> torch.Tensor:
    return q.scales.repeat_interleave(q.block)[:n]


def _within(out: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> bool:
    return bool(torch.all((out.float() - exact).abs() <= bound * (1 + SLACK) + 1e-6))


def _check_rs_one_hop(rank: int, g, order, n: int, block: int, ledger: Ledger, salt: int) -> bool:
    inp = _data(rank, n * g.size, salt=salt)
    out = torch.empty(n)
    reduce_scatter_int4(out, inp, g, block=block, order=order, ledger=ledger)
    chunk = (order or list(range(g.size)))[g.position]
    parts = [_data(r, n * g.size, salt=salt).view(g.size, n)[chunk] for r in g.ranks]
    exact = torch.stack(parts).sum(0)
    bound = sum(_scale_per_element(quantize_int4(p, block), n) / 2 for p in parts)
    return _within(out, exact, bound) and not torch.equal(out, exact)


def _qc_rank(rank: int, world: int, nodes: int, permuted: bool) -> dict:
    topo = load_topology("emulated", nodes=nodes)
    checks: dict[str, bool] = {}
    ledger = Ledger()
    observed: list[tuple[str, int, int]] = []
    collectives.observe_collectives(lambda op, pg, n, width: observed.append((op, n, width)))
    # zerotopo: params = package (int8 all-gather), secondary = node, grads = node (one-hop int4).
    mesh = build_mesh(topo, get_preset("zerotopo"), topo_index=_topo_index(rank, permuted))
    for kind, n, block, dtype in (("params", 13, 4, torch.bfloat16), ("secondary", 32, 8, torch.float32)):
        g = mesh.group(kind)
        shard = _data(rank, n, dtype, salt=1)
        out = torch.empty(n * g.size, dtype=dtype)
        if kind == "params":
            pending = all_gather_int8(out, shard, g, block=block, ledger=ledger, async_op=True)
            pending.wait()
            checks["ag8 completed"] = pending.is_completed()
        else:
            gather_quantized(out, quantize_int8(shard, block), g, ledger=ledger)
        shards = [_data(r, n, dtype, salt=1) for r in g.ranks]
        ref = torch.cat([dequantize(quantize_int8(s, block)) for s in shards])
        checks[f"ag8 {kind} = reference"] = torch.equal(out, ref)
        bound = torch.cat([_scale_per_element(quantize_int8(s, block), n) / 2 for s in shards])
        eps = torch.finfo(dtype).eps * torch.cat(shards).float().abs()
        checks[f"ag8 {kind} bound"] = _within(out, torch.cat(shards).float(), bound + eps)
    g = mesh.group("grads")
    checks["rs4 grads order"] = _check_rs_one_hop(
        rank, g, layout.reduce_scatter_order(mesh.degrees), 16, 8, ledger, 2
    )
    checks["rs4 partial block"] = _check_rs_one_hop(rank, g, None, 10, 4, ledger, 3)
    collectives.observe_collectives(None)
    records = [(r.op, r.kind, r.tier, r.numel, r.bytes_sent) for r in ledger.records()]
    result = {"checks": checks, "records": records, "two_hop": [], "observed": observed}

    if nodes > 1:
        # zero3: grads over the world (2 nodes): two hops, inside the node then across nodes.
        mesh = build_mesh(topo, get_preset("zero3"), topo_index=_topo_index(rank, permuted))
        g, intra, inter = (mesh.group(k) for k in ("grads", "grads_intra", "grads_inter"))
        a, b, n, block = intra.size, inter.size, 16, 8
        order = layout.reduce_scatter_order(mesh.degrees)
        inp = _data(rank, n * g.size, salt=4)
        out = torch.empty(n)
        two = Ledger()
        reduce_scatter_int4(out, inp, g, block=block, order=order, intra=intra, inter=inter, ledger=two)
        chunk = order[g.position]
        exact = sum(_data(r, n * g.size, salt=4).view(g.size, n)[chunk] for r in g.ranks)
        # Bound: each rank's hop-1 quantization of this chunk, plus each node's hop-2 quantization of its
        # partial sum (chunks are whole blocks here, so the bundles' blocks are the chunks' blocks).
        bound = torch.zeros(n)
        for k in range(b):
            node_ranks = g.ranks[k * a : (k + 1) * a]
            parts = [_data(r, n * g.size, salt=4).view(g.size, n)[chunk] for r in node_ranks]
            partial = torch.stack([dequantize(quantize_int4(p, block)) for p in parts]).sum(0)
            bound += sum(_scale_per_element(quantize_int4(p, block), n) / 2 for p in parts)
            bound += _scale_per_element(quantize_int4(partial, block), n) / 2
        checks["rs4 two-hop bound"] = _within(out, exact, bound) and not torch.equal(out, exact)
        # One hop on the same input, for comparison: both within their bounds of the same exact sum.
        one = torch.empty(n)
        reduce_scatter_int4(one, inp, g, block=block, order=order)
        checks["rs4 one-hop on world"] = _within(one, exact, bound)
        result["two_hop"] = [(r.op, r.kind, r.tier, r.numel, r.bytes_sent) for r in two.records()]
        result["sizes"] = (a, b)
    return result


@pytest.mark.parametrize(
    "nodes,permuted", [(1, False), (2, True)], ids=["4-ranks-1-node", "8-ranks-2-nodes-closest-binding"]
)
def test_quantized_collectives(nodes: int, permuted: bool) -> None:
    world = 4 * nodes
    results = spawn(_qc_rank, world, args=(nodes, permuted), ranks_per_node=4, timeout_s=240)
    for rank, res in enumerate(results):
        failed = [k for k, ok in res["checks"].items() if not ok]
        assert not failed, f"rank {rank}: {failed}"
        recs = res["records"]
        assert [r[0] for r in recs] == ["all_gather_int8"] * 2 + ["reduce_scatter_int4"] * 2
        (_, _, t0, n0, b0), (_, _, t1, n1, b1), (_, _, t2, n2, b2), (_, _, t3, n3, b3) = recs
        assert (t0, b0) == ("package", volume.int8_all_gather_bytes(n0, 2, 4))
        assert (t1, b1) == ("node", volume.int8_all_gather_bytes(n1, 4, 8))
        assert (t2, b2) == ("node", volume.int4_reduce_scatter_bytes(n2, 4, 8))
        assert (t3, b3) == ("node", volume.int4_reduce_scatter_bytes(n3, 4, 4))
        # an observer (the bench's curve replay) is told each whole message as it goes on the wire: the
        # codes and scales of every position, in bytes, as the cost model's schedule sizes it
        assert res["observed"] == [
            ("all_gather_int8", 2 * volume.int8_payload(13, 4), 1),
            ("all_gather_int8", 4 * volume.int8_payload(32, 8), 1),
            ("reduce_scatter_int4", 4 * volume.int4_payload(16, 8), 1),
            ("reduce_scatter_int4", 4 * volume.int4_payload(10, 4), 1),
        ]
        if nodes > 1:
            a, b = res["sizes"]
            assert (a, b) == (4, 2)
            (op1, k1, tier1, num1, by1), (op2, k2, tier2, num2, by2) = res["two_hop"]
            assert (k1, tier1, k2, tier2) == ("grads_intra", "node", "grads_inter", "network")
            assert (by1, by2) == volume.int4_reduce_scatter_2hop_bytes(num1, a, b, 8)
            assert num1 == 16 * 8 and num2 == num1 // a
