"""Every plan the planner can return trains: candidates drawn from its whole search space
(:func:`zerotopo.placement.plan.enumerate_plans` on 8 ranks: every degree triple, secondary partitions of every
degree 1 to world in bf16 and int8, int8 weights and int4 gradients) each train two steps inside one
spawn of 8 gloo ranks, against the single-process AdamW reference, with memory and ledger bytes
equal to the cost model's.

The 560 plans of the space are covered by a deterministic selection of about 40 that holds every degree
triple and every pair of the factors the engine branches on (primary degree with secondary degree and
dtype, secondary with gradient degree, each with the quantization flags), so the run stays within a few
minutes on a loaded 2-core machine; ``ZEROTOPO_TEST_EVERY_CANDIDATE=1`` runs all of them.
"""

from __future__ import annotations

import os

import pytest

from tests.engine.cases import MICRO, WORLD, reference, rel_err, train_worker
from zerotopo.cost.comm import bytes_by_op_tier, comm_per_step
from zerotopo.cost.memory import memory_per_device
from zerotopo.launch.spawn import spawn
from zerotopo.placement.plan import Plan, enumerate_plans
from zerotopo.placement.topology import load_topology

pytestmark = pytest.mark.slow

STEPS = 2


def _features(p: Plan) -> set[tuple]:
    """The factor combinations the engine branches on, one candidate's share of them."""
    s = (p.secondary, p.secondary_dtype if p.secondary is not None else None)
    q = (p.quantize_weights, p.quantize_grads)
    return {
        ("degrees", p.params, p.grads, p.optim),
        ("params-secondary", p.params, s),
        ("secondary-quant", s, q),
        ("params-quant", p.params, q),
        ("grads-quant", p.grads, q),
        ("secondary-grads", s, p.grads),
    }


def candidates(every: bool = False) -> list[Plan]:
    """The planner's search space on the emulated 8-rank topology, or a covering selection of it."""
    space = enumerate_plans(load_topology("emulated"))
    if every:
        return space
    need = set().union(*(_features(p) for p in space))
    chosen: list[Plan] = []
    while need:  # greedy cover, deterministic: the first plan covering the most uncovered combinations
        best = max(space, key=lambda p: len(_features(p) & need))
        chosen.append(best)
        need -= _features(best)
    return chosen


def kind(p: Plan) -> str:
    """How close to the fp32 reference the plan trains (see test_parity's bounds)."""
    gathers_secondary = p.secondary is not None and p.params > 1  # p = 1 keeps every full weight
    if p.quantize_weights or p.quantize_grads or (gathers_secondary and p.secondary_dtype == "int8"):
        return "quantized"
    return "bf16" if gathers_secondary else "exact"


@pytest.fixture(scope="module")
def runs():
    plans = candidates(os.environ.get("ZEROTOPO_TEST_EVERY_CANDIDATE") == "1")
    cases = [{"plan": p, "steps": STEPS} for p in plans]
    results = spawn(train_worker, WORLD, args=(cases,), ranks_per_node=4, timeout_s=1800)
    ref_losses, ref_params = reference({}, steps=STEPS)
    return plans, results, ref_losses, ref_params


def test_selection_covers_the_search_space():
    space = enumerate_plans(load_topology("emulated"))
    chosen = candidates()
    assert len(chosen) < 60
    covered = set().union(*(_features(p) for p in chosen))
    assert covered == set().union(*(_features(p) for p in space))
    # every degree triple, every secondary degree 1..world in both dtypes, every quantization flag
    assert {(p.params, p.grads, p.optim) for p in chosen} == {(p.params, p.grads, p.optim) for p in space}
    assert {(p.secondary, p.secondary_dtype) for p in chosen if p.secondary} == {
        (s, dt) for s in (1, 2, 4, 8) for dt in ("bf16", "int8")
    }
    assert {(p.quantize_weights, p.quantize_grads) for p in chosen} == {
        (a, b) for a in (False, True) for b in (False, True)
    }
    assert any(p.params == 2 and p.secondary == 1 and p.secondary_dtype == "bf16" for p in chosen)


def _loss_err(results, i, ref_losses) -> float:
    return max(
        abs(results[r][i]["losses"][s][m] - ref_losses[s][r][m]) / abs(ref_losses[s][r][m])
        for r in range(WORLD)
        for s in range(STEPS)
        for m in range(MICRO)
    )


def _global_rel(params, ref) -> float:
    num = sum(float((params[k] - ref[k]).pow(2).sum()) for k in ref)
    return (num / sum(float(ref[k].pow(2).sum()) for k in ref)) ** 0.5


def test_every_candidate_trains_against_the_reference(runs):
    plans, results, ref_losses, ref_params = runs
    bounds = {"exact": (1e-5, 1e-5), "bf16": (1e-3, 1e-2), "quantized": (1e-2, 5e-2)}
    for i, plan in enumerate(plans):
        loss_bound, param_bound = bounds[kind(plan)]
        params = results[0][i]["params"]
        assert not results[0][i]["nonfinite"], plan.name
        assert _loss_err(results, i, ref_losses) < loss_bound, plan.name
        if kind(plan) == "exact":
            worst = max(rel_err(params[k], ref_params[k]) for k in ref_params)
        else:
            worst = _global_rel(params, ref_params)
        assert worst < param_bound, (plan.name, worst)


def test_every_candidate_memory_and_bytes_equal_the_cost_model(runs):
    plans, results, _, _ = runs
    topo = load_topology("emulated")
    for i, plan in enumerate(plans):
        numels = results[0][i]["unit_numels"]
        want_mem = memory_per_device(numels, topo, plan, param_bytes=4)
        want_bytes = {k: v for k, v in bytes_by_op_tier(
            comm_per_step(numels, topo, plan, micro_batches=MICRO, param_bytes=4, reduce_bytes=4)
        ).items() if v}  # fmt: skip
        for r in range(WORLD):
            got = results[r][i]["memory"]
            assert got == {
                "params": want_mem.params,
                "secondary": want_mem.secondary,
                "grads": want_mem.grads,
                "optim": want_mem.optim,
            }, (plan.name, r)
            assert results[r][i]["ledger"] == want_bytes, (plan.name, r)
