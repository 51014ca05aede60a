"""Muon's owner-held state on 8 gloo ranks (zerotopo/engine/muon.py, [Note: Muon with owner-held state]):
under mics (two optimizer groups of 4) each matrix's fp32 master and momentum live whole on exactly one
owner per group and equal the chunks' state gathered per parameter; the exchange moves exactly the
pieces :class:`~zerotopo.placement.matrices.Exchange` prices; the memory report counts the owned
state; the optimizer's state dict round-trips through the owners; and weights loaded from a full state
dict reach the owners."""

from __future__ import annotations

import pytest
import torch

from tests.engine.cases import MICRO, batch, loss_fn, make_model
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

MUON = {"momentum": 0.9, "nesterov": True, "aux": {"type": "AdamW", "lr": 3e-3}}


def _step(model, optimizer, step: int, rank: int) -> None:
    for m in range(MICRO):
        x, y = batch(step, rank, m)
        (loss_fn(model(x), y) / MICRO).backward()
    optimizer.step()
    optimizer.zero_grad()


def _worker(rank: int, world: int) -> dict:
    from zerotopo.comm.ledger import Ledger
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated"), get_preset("mics"), topo_index=rank)
    ledger = Ledger()
    model = debug.parallelize(make_model({}), mesh=mesh, options=debug.DebugOptions(ledger=ledger))
    opt = ShardedOptimizer(model, "Muon", lr=0.02, weight_decay=0.1, **MUON)
    full0 = model.full_state_dict()
    out: dict = {"names": [s.name for _, s in opt.matrices], "owners": opt.owners, "me": opt._me}
    out["owned_at_start"] = all(
        torch.equal(t, full0[opt.matrices[k][1].name]) for k, t in opt.owned_master.items()
    )
    _step(model, opt, 0, rank)
    ledger.reset()
    _step(model, opt, 1, rank)
    out["a2a"] = {r.tag: r.bytes_sent for r in ledger.records() if r.op == "all_to_all"}
    out["sent"], out["received"] = opt.exchange.sent(opt._me), opt.exchange.received(opt._me)
    out["step_bytes"] = opt.exchange.step_bytes(opt._me)
    full = model.full_state_dict()
    out["owned_equal_weights"] = all(
        torch.equal(t, full[opt.matrices[k][1].name]) for k, t in opt.owned_master.items()
    )
    out["owned_names"] = sorted(opt.matrices[k][1].name for k in opt.owned_master)
    out["owned_elements"] = sum(t.numel() for t in opt.owned_master.values())
    out["momentum_nonzero"] = all(bool(t.abs().sum() > 0) for t in opt.owned_momentum.values())
    mem = model.memory_report()
    chunk = sum(u.o_range[1] - u.o_range[0] for u in model.units)
    out["memory"] = (mem["optim"], chunk * opt.bytes_per_element, opt.owned_bytes, opt.state_bytes())
    out["describe"] = opt.describe()
    # the state dict carries the owners' momentum per element: zero the owners, load it back
    sd = opt.state_dict()
    before = {k: (opt.owned_master[k].clone(), opt.owned_momentum[k].clone()) for k in opt.owned_master}
    for k in opt.owned_master:
        opt.owned_master[k].zero_()
        opt.owned_momentum[k].zero_()
    opt.load_state_dict(sd)
    out["round_trip"] = all(
        torch.equal(opt.owned_master[k], a) and torch.equal(opt.owned_momentum[k], b)
        for k, (a, b) in before.items()
    )
    # weights loaded from a full state dict reach the owners (the next step starts from them)
    model.load_full_state_dict(full0)
    out["full_load"] = all(
        torch.equal(t, full0[opt.matrices[k][1].name]) for k, t in opt.owned_master.items()
    )
    model.close()
    return out


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 8, ranks_per_node=4, timeout_s=900)


def test_each_matrix_is_held_whole_by_one_owner_per_optimizer_group(results):
    names = results[0]["names"]
    assert len(names) == 6  # up and down of the three blocks
    for group in (results[:4], results[4:]):  # mics: one optimizer group per node
        owned = [n for r in group for n in r["owned_names"]]
        assert sorted(owned) == sorted(names)  # each exactly once in the group
        for r in group:
            assert r["owned_names"] == sorted(names[k] for k, q in enumerate(r["owners"]) if q == r["me"])
    for r in results:
        assert r["owned_at_start"] and r["owned_equal_weights"] and r["momentum_nonzero"]


def test_the_exchange_moves_exactly_the_priced_pieces_unpadded(results):
    for r in results:
        a2a = r["a2a"]
        assert a2a["muon grads to owners"] == 4 * r["sent"]
        assert a2a["muon weights to shards"] == 4 * r["received"]
        assert sum(a2a.values()) == r["step_bytes"]  # nothing else moves all-to-all in a step
    assert any(r["step_bytes"] > 0 for r in results)


def test_memory_report_counts_the_chunks_and_the_owned_matrices(results):
    for r in results:
        optim, chunks, owned, state = r["memory"]
        assert owned == 8 * r["owned_elements"]  # fp32 master and momentum
        assert optim == chunks + owned
        assert state["shards"] == chunks and state["owned"] == owned
        assert f"{state['per_param']:.2f} bytes per parameter" in r["describe"]
        assert "imbalance (max/mean) FLOPs" in r["describe"] and "bytes" in r["describe"]


def test_state_dict_round_trips_through_the_owners_and_full_loads_reach_them(results):
    for r in results:
        assert r["round_trip"] and r["full_load"]
