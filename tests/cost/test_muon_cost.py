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
    # optimizer GiB, printed to 0.01: 16 bytes per chunk element instead of 12, and the busiest owner's
    # whole matrices (fp32 master and momentum) beside them (zero1: the optim group is the job's 16 ranks)
    from zerotopo.config.model_files import load_model

    shape, _ = load_model(["neox-125m"], None)
    owned = muon_cost(shape, Degrees(1, 1, 16, world=16), load_topology("frontier", nodes=2)).owned_bytes
    assert owned > 0
    assert float(muon[2]) == pytest.approx(float(adamw[2]) * 16 / 12 + owned / 2**30, abs=0.01)
    assert float(muon[5]) > float(adamw[5])  # step s


# -- the planner prices Muon in its search (CostOptions.muon) ----------------------------------------------


def _neox20b_on_48_frontier_nodes():
    """The shape, topology and AdamW options ``zerotopo plan --model neox-20b --nodes 48`` costs."""
    from zerotopo.config.model_files import load_model
    from zerotopo.cost.planner import CostOptions

    shape, neox = load_model(["neox-20b"], None)
    options = CostOptions(
        micro_batch=neox.batch.micro_batch_size or 1, grad_accum=neox.batch.gradient_accumulation_steps or 1,
        checkpoint_activations=bool(neox.model.checkpoint_activations), grad_dtype=neox.precision.grad_dtype,
    )  # fmt: skip
    return shape, load_topology("frontier", nodes=48), options


def test_muon_pricing_adds_the_owner_and_exchange_time_and_changes_the_pick():
    from dataclasses import replace

    from zerotopo.cost.muon import MuonPricing
    from zerotopo.cost.planner import plan_candidates

    shape, topo, adamw = _neox20b_on_48_frontier_nodes()
    muon = replace(adamw, muon=MuonPricing())
    plans = ["zero3", "mics"]
    a = {e.name: e for e in plan_candidates(shape, topo, plans=plans, options=adamw)}
    m_list = plan_candidates(shape, topo, plans=plans, options=muon)
    m = {e.name: e for e in m_list}
    for name in plans:
        c = muon_cost(shape, a[name].degrees, topo, efficiency=adamw.efficiency)
        assert m[name].muon == c and a[name].muon is None
        # the step: AdamW's plus the busiest owner's Newton-Schulz and the exchange, nothing else
        assert m[name].time.step_time_s == pytest.approx(a[name].time.step_time_s + c.ns_s + c.exchange_s)
        assert m[name].time.tokens_per_s == pytest.approx(
            a[name].time.tokens_per_s * a[name].time.step_time_s / m[name].time.step_time_s
        )
        # the memory: 16 bytes of optimizer state per parameter of the chunk instead of 12, and the busiest
        # owner's whole matrices (fp32 master and momentum) beside them; the rest unchanged
        assert c.owned_bytes > 0
        assert m[name].memory.optim == pytest.approx(a[name].memory.optim * 16 / 12 + c.owned_bytes)
        assert m[name].memory.total - m[name].memory.optim == a[name].memory.total - a[name].memory.optim
        assert "muon" in m[name].to_json(topo) and "muon" not in a[name].to_json(topo)
    # mics: 8 owners per node share all 176 matrices (3.75 s of Newton-Schulz each); zero3's 384 share
    # them job-wide (0.22 s on the busiest): AdamW ranks mics first, Muon zero3
    assert min(a.values(), key=lambda e: e.time.step_time_s).name == "mics"
    assert m_list[0].name == "zero3"
    assert m["mics"].time.step_time_s - a["mics"].time.step_time_s > 3.5
    assert m["zero3"].time.step_time_s - a["zero3"].time.step_time_s < 0.5


def test_auto_search_under_muon_keeps_the_exhaustive_searchs_best():
    """The search's lower bound counts Muon too (the busiest owner does at least the mean), so the
    exact ``auto`` search returns the fastest plans of ``all`` under Muon."""
    from zerotopo.config.model_files import load_model
    from zerotopo.cost.muon import MuonPricing
    from zerotopo.cost.planner import AUTO_TOP, CostOptions, plan_candidates

    shape, _ = load_model(["neox-1-3b"], None)
    topo = load_topology("frontier", nodes=4)
    opts = CostOptions(muon=MuonPricing(), search_tolerance=0.0)
    every = [e for e in plan_candidates(shape, topo, plans="all", options=opts) if e.fits]
    auto = [e for e in plan_candidates(shape, topo, plans="auto", options=opts) if e.fits]
    best = sorted(e.time.step_time_s for e in every)[:AUTO_TOP]
    assert sorted(e.time.step_time_s for e in auto)[:AUTO_TOP] == pytest.approx(best, rel=1e-12)
    assert all(e.muon is not None for e in auto)


def test_muon_lower_bound_is_below_the_cost():
    from zerotopo.cost.muon import ns_seconds_lower_bound

    topo = load_topology("emulated")
    for d in (Degrees(1, 1, 1, 8), Degrees(1, 1, 4, 8), Degrees(2, 4, 8, 8)):
        assert ns_seconds_lower_bound(SHAPE, d, topo) <= muon_cost(SHAPE, d, topo).seconds


def test_plan_ranks_by_the_first_optimizer_or_the_configs(capsys):
    from zerotopo.cli.main import main
    from zerotopo.cli.plan import optimizer_pricing
    from zerotopo.config.tree import OptimizerConfig
    from zerotopo.cost.muon import MuonPricing

    def ranking(*extra: str) -> list[str]:
        argv = ["plan", "--model", "neox-20b", "--nodes", "48", "--plans", "zero3,mics", *extra]
        assert main(argv) == 0
        out = capsys.readouterr().out
        return [line.split()[0] for line in out.splitlines() if line.split()[:1] in (["zero3"], ["mics"])]

    assert ranking()[:2] == ["mics", "zero3"]  # the config's AdamW
    assert ranking("--optimizer", "adamw,muon")[:2] == ["mics", "zero3"]
    assert ranking("--optimizer", "muon,adamw")[:2] == ["zero3", "mics"]
    # a config whose optimizer is Muon is priced as Muon, with its Newton-Schulz steps and aux states
    muon = OptimizerConfig(type="Muon", options={"ns_steps": 3, "aux": {"type": "SGD"}})
    assert optimizer_pricing(muon, None) == {"muon": MuonPricing(ns_steps=3, aux_states=0)}
    assert optimizer_pricing(muon, "adamw") == {"optim_bytes_per_param": 12}
    assert optimizer_pricing(OptimizerConfig(), None) == {"optim_bytes_per_param": 12}
    assert optimizer_pricing(OptimizerConfig(), "muon") == {"muon": MuonPricing()}


@pytest.mark.slow  # two full searches on 384 ranks
def test_the_search_picks_another_plan_for_muon():
    """NeoX-20B on 48 Frontier nodes: AdamW's search picks a plan with smaller optimizer groups (p=2 g=2
    o=96 today), where Muon's owners would each orthogonalize more matrices; Muon's search picks a plan
    that is faster once that is counted."""
    from dataclasses import replace

    from zerotopo.cost.muon import MuonPricing
    from zerotopo.cost.planner import best_plan, plan_candidates

    shape, topo, adamw = _neox20b_on_48_frontier_nodes()
    a = best_plan(plan_candidates(shape, topo, plans="auto", options=adamw))
    m = best_plan(plan_candidates(shape, topo, plans="auto", options=replace(adamw, muon=MuonPricing())))
    assert a is not None and m is not None and a.degrees != m.degrees
    a_under_muon = a.time.step_time_s + muon_cost(shape, a.degrees, topo, efficiency=adamw.efficiency).seconds
    assert m.time.step_time_s < a_under_muon
    assert m.degrees.optim > a.degrees.optim  # more owners share the 176 matrices
