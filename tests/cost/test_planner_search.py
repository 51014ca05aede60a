"""``plans="auto"``: pruned by memory, bounded, exact with ``search_tolerance=0`` and within the model's
measured error by default; the lower bound never exceeds a simulated step; ties reported by memory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.cost.test_planner import SHAPE, _quad
from zerotopo.cost import planner as P
from zerotopo.cost.planner import AUTO_TOP, MODEL_ERROR, CostOptions, plan_candidates, tie_line
from zerotopo.cost.time import OverlapModel
from zerotopo.placement.plan import PRESETS
from zerotopo.placement.topology import load_topology

CASES = [
    (_quad(2), CostOptions(micro_batch=2, grad_accum=2)),
    (_quad(2), CostOptions(micro_batch=1, grad_accum=3, overlap=OverlapModel(concurrent=1))),
    (load_topology("frontier", nodes=2), CostOptions(micro_batch=1, grad_accum=2)),
    (load_topology("emulated"), CostOptions(micro_batch=1, grad_accum=1, overlap=OverlapModel(concurrent=3))),
]


def _lins(est):
    return [e for e in est if e.name not in PRESETS]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_lower_bound_never_exceeds_the_simulated_step(case):
    topo, opts = CASES[case]
    search = P._Search()
    presets = {P.placement(p, topo) for p in P._presets(topo)}
    for p, d in P._search_space(topo, True, presets):
        f = P._fit(p, SHAPE, topo, opts, d, 1, search=search)
        exact = P._finish(P._complete(f, topo, opts, None), SHAPE, topo, opts).time.step_time_s
        assert P._bound(f, SHAPE, topo, opts, search) <= exact * (1 + 1e-12), p.name


@pytest.mark.parametrize("case", range(len(CASES)))
def test_exact_auto_is_the_best_of_all_and_the_default_within_the_model_error(case):
    topo, opts = CASES[case]
    everything = {e.name: e for e in _lins(plan_candidates(SHAPE, topo, plans="all", options=opts))}
    fitting = sorted((e for e in everything.values() if e.fits), key=P._sort_key)
    exact = _lins(plan_candidates(SHAPE, topo, plans="auto", options=replace(opts, search_tolerance=0.0)))
    assert [e.name for e in exact] == [e.name for e in fitting[:AUTO_TOP]]
    default = _lins(plan_candidates(SHAPE, topo, plans="auto", options=opts))
    assert 0 < len(default) <= AUTO_TOP
    for e in default + exact:  # the same figures as costing the plan alone
        assert e.time.step_time_s == everything[e.name].time.step_time_s
        assert e.memory == everything[e.name].memory
    # nothing left out beats the reported plans by more than the model's measured error
    reported = {e.name for e in default}
    if len(default) == AUTO_TOP:
        for e in fitting:
            if e.name not in reported:
                assert e.time.step_time_s >= default[-1].time.step_time_s * (1 - MODEL_ERROR), e.name


def test_search_tolerance_is_checked():
    with pytest.raises(ValueError, match="search_tolerance"):
        CostOptions(search_tolerance=1.0)


def test_plans_within_the_model_error_are_tied_and_broken_by_memory():
    topo = load_topology("frontier", nodes=48)
    from zerotopo.config.model_files import load_model

    shape, _ = load_model(["configs/neox-20b.yml"], None)
    opts = CostOptions(micro_batch=4, grad_dtype="param")
    est = plan_candidates(shape, topo, plans="zero3,mics,zeropp,zero1", options=opts)
    line = tie_line([e for e in est if e.fits], topo)
    assert line.startswith("tied: ") and f"model's measured error ({100 * MODEL_ERROR:g}%)" in line
    smallest = min((e for e in est if e.fits), key=lambda e: e.memory.total)
    assert f"by memory {smallest.name} (" in line and "\n" not in line
    assert tie_line(est[:1], topo) == ""
