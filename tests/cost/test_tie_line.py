"""The recommendation's tie line counts plans, not estimates: a plan named twice, a preset under another
name (hsdp is mics) or a plan printed alike is one plan and no tie; the plan with least memory is named
once, with its degrees only where its name is not them; and a plan is never its own runner-up."""

from __future__ import annotations

import pytest

from zerotopo.config.model_files import load_model
from zerotopo.cost.planner import CostOptions, plan_candidates, recommendation, tie_line
from zerotopo.placement.plan import Plan
from zerotopo.placement.topology import load_topology

OPTS = CostOptions(micro_batch=4, grad_dtype="param")


@pytest.fixture(scope="module")
def shape():
    return load_model(["configs/neox-20b.yml"], None)[0]


def _fitting(shape, topo, plans):
    return [e for e in plan_candidates(shape, topo, plans=plans, options=OPTS) if e.fits]


def _searched(p: int, g: int, o: int) -> Plan:
    """A plan as the search names it: by its degrees."""
    return Plan(f"p={p} g={g} o={o}", p, g, o)


@pytest.mark.parametrize("plans", [["zero3", "zero3"], ["mics", "hsdp"], [_searched(8, 8, 8), "zero3"]])
def test_one_plan_twice_is_no_tie_and_not_its_own_runner_up(shape, plans):
    topo = load_topology("frontier", nodes=1 if isinstance(plans[0], Plan) else 48)
    est = _fitting(shape, topo, plans)
    assert len(est) == 2 and est[0].time.step_time_s == est[1].time.step_time_s
    assert tie_line(est, topo) == ""
    advice = recommendation(est, shape, topo, OPTS)
    assert "tied:" not in advice and "throughput of" not in advice, advice


def test_a_fastest_plan_with_least_memory_is_named_once(shape):
    topo = load_topology("frontier", nodes=1)
    est = _fitting(shape, topo, ["zero3", "zeropp"])
    line = tie_line(est, topo)
    assert line.startswith("tied: 2 plans predict ") and line.count("zero3") == 1, line
    assert line.endswith("the fastest, zero3 (p=8 g=8 o=8), also needs the least memory, 47.9 GiB per device")


def test_a_plan_named_by_its_degrees_is_not_named_twice(shape):
    topo = load_topology("frontier", nodes=1)
    est = _fitting(shape, topo, [_searched(2, 8, 8), _searched(8, 8, 8)])
    line = tie_line(est, topo)
    assert (
        "by memory p=8 g=8 o=8 wins with 47.9 GiB per device against 62.2 GiB for the fastest, p=2 g=8 o=8"
        in line
    )
    assert "(p=8 g=8 o=8)" not in line
