"""Muon's cost (zerotopo/cost/muon.py) and ``zerotopo plan --optimizer adamw,muon``: the state bytes, the
Newton-Schulz FLOPs of the busiest owner, the exchange only where the optim group has several positions."""

from __future__ import annotations

import pytest

from zerotopo.cost.muon import model_matrices, muon_cost
from zerotopo.placement.plan import Degrees
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology

SHAPE = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=512)


def test_matrices_are_the_layers_2d_weights():
    mats = model_matrices(SHAPE)
    assert len(mats) == 4 * 4  # qkv, dense, h->4h, 4h->h per layer; not the embedding or the head
    assert {(m.rows, m.cols) for m in mats} == {(192, 64), (64, 64), (256, 64), (64, 256)}
    assert all(1 <= m.unit <= 4 for m in mats)


def test_cost_per_degree():
    topo = load_topology("emulated")
    one = muon_cost(SHAPE, Degrees(1, 1, 1, 8), topo)
    assert one.exchange_bytes == 0 and one.exchange_tier is None and one.exchange_s == 0
    assert one.ns_flops == sum(m.ns_flops() for m in model_matrices(SHAPE)) and one.flops_imbalance == 1.0
    eight = muon_cost(SHAPE, Degrees(1, 1, 8, 8), topo)
    assert eight.ns_flops < one.ns_flops / 4 and eight.exchange_tier == topo.network.name
    assert eight.exchange_bytes > 0 and eight.exchange_s > 0
    assert (
        eight.state_bytes_per_param == 16
        and muon_cost(SHAPE, Degrees(1, 1, 8, 8), topo, aux_states=0).state_bytes_per_param == 8
    )
    # more positions than matrices: some own none, the busiest sets the pace
    tiny = ModelShape(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=512)
    assert muon_cost(tiny, Degrees(1, 1, 8, 8), topo).flops_imbalance == pytest.approx(
        8 * max(m.ns_flops() for m in model_matrices(tiny)) / sum(m.ns_flops() for m in model_matrices(tiny))
    )


def test_plan_cli_shows_muon_beside_adamw(capsys):
    from zerotopo.cli.main import main

    assert (
        main(
            [
                "plan",
                "--model",
                "neox-125m",
                "--nodes",
                "2",
                "--plans",
                "zero1,mics",
                "--optimizer",
                "adamw,muon",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["zero1"], ["mics"])]
    assert {(r[0], r[1]) for r in rows if r[1] in ("AdamW", "Muon")} == {
        ("zero1", "AdamW"),
        ("zero1", "Muon"),
        ("mics", "AdamW"),
        ("mics", "Muon"),
    }
    adamw, muon = (next(r for r in rows if r[:2] == ["zero1", k]) for k in ("AdamW", "Muon"))
    # optimizer GiB, printed to 0.01
    assert float(muon[2]) == pytest.approx(float(adamw[2]) * 16 / 12, abs=0.01)
    assert float(muon[5]) > float(adamw[5])  # step s
