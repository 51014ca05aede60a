"""Every optimizer of the table (zerotopo/config/optimizers.py) on 4 gloo ranks under a sharded plan
against the same torch class on an unsharded copy of the model in one process, within the exact plans'
tolerance (tests/engine/test_parity.py: 1e-5 relative); and fp16 loss scaling on optimizers without a
fused kernel (the host reads the overflow flag and skips the step)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.engine.cases import MICRO, batch, loss_fn, make_model, reference, rel_err
from zerotopo.config.optimizers import spec_for
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

WORLD, STEPS = 4, 3
# params 2, grads 2, optim 4: every optimizer chunk is a quarter of a unit, cut across parameters
PLAN = {"name": "p2g2o4", "params": 2, "grads": 2, "optim": 4}
ADAM = {"betas": (0.9, 0.95), "eps": 1e-8}
CASES: list[dict[str, Any]] = [
    {"optimizer": "AdamW", "optimizer_params": dict(ADAM)},
    {"optimizer": "AdamW", "optimizer_params": {**ADAM, "amsgrad": True}},
    {"optimizer": "SGD", "optimizer_params": {"momentum": 0.9, "nesterov": True}},
    # torch takes the first momentum buffer from the gradient itself: differs from a zero buffer here
    {"optimizer": "SGD", "optimizer_params": {"momentum": 0.9, "dampening": 0.5}},
    {"optimizer": "SGD", "optimizer_params": {}},
    {"optimizer": "Adagrad", "optimizer_params": {"lr_decay": 0.01, "initial_accumulator_value": 0.1, "eps": 1e-10}},
    {"optimizer": "Adadelta", "optimizer_params": {"rho": 0.9, "eps": 1e-6}, "lr": 1.0},
    {"optimizer": "RMSprop", "optimizer_params": {"alpha": 0.9, "eps": 1e-8, "momentum": 0.5, "centered": True}},
    {"optimizer": "Adamax", "optimizer_params": dict(ADAM)},
    {"optimizer": "NAdam", "optimizer_params": {**ADAM, "momentum_decay": 4e-3}},
    {"optimizer": "RAdam", "optimizer_params": {**ADAM, "decoupled_weight_decay": True}},
]  # fmt: skip
# fp16 with an overflow at step 1: optimizers that run torch's foreach kernel (the host reads the flag)
FP16 = [
    {"optimizer": "RMSprop", "optimizer_params": {"momentum": 0.5}},
    {"optimizer": "SGD", "optimizer_params": {"momentum": 0.9, "dampening": 0.5}},
]


def _worker(rank: int, world: int, cases: list[dict[str, Any]], fp16: list[dict[str, Any]]) -> list[dict]:
    import torch

    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, parallelize
    from zerotopo.engine.optim import make_scaler
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated", nodes=1), load_plan(PLAN), topo_index=rank)
    out = []
    for case in [*cases, *({**c, "fp16": True} for c in fp16)]:
        param_dtype = torch.float16 if case.get("fp16") else torch.float32
        model = parallelize(make_model({}), mesh=mesh, mp_policy=MixedPrecision(param_dtype))
        opt = ShardedOptimizer(
            model, case["optimizer"], lr=case.get("lr", 1e-2), weight_decay=0.1, max_grad_norm=1.0,
            loss_scale=make_scaler("dynamic", param_dtype, hysteresis=1), **(case["optimizer_params"] or {}),
        )  # fmt: skip
        losses, skipped = [], []
        for s in range(STEPS):
            per_micro = []
            for m in range(MICRO):
                x, y = batch(s, rank, m)
                loss = loss_fn(model(x), y) / MICRO
                per_micro.append(loss.item())
                boost = 1e30 if case.get("fp16") and s == 1 else 1.0
                model.scale_loss(loss * boost).backward()
            skipped.append(bool(opt.step()["skipped"]))
            opt.zero_grad()
            losses.append(per_micro)
        sd = model.full_state_dict()
        out.append(
            {
                "losses": losses,
                "skipped": skipped,
                "params": sd if rank == 0 else None,
                "steps": opt.step_count,
                "optim_bytes": model.memory_report()["optim"],
                "optim_elems": sum(u.o_range[1] - u.o_range[0] for u in model.units),
                "states": list(opt.states),
            }
        )
        model.close()
    return out


@pytest.fixture(scope="module")
def runs():
    return spawn(_worker, WORLD, args=(CASES, FP16), ranks_per_node=WORLD, timeout_s=900)


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: f"{CASES[i]['optimizer']}-{i}")
def test_sharded_step_equals_torch_on_the_unsharded_model(runs, i):
    case = CASES[i]
    opts = {**case, "weight_decay": 0.1, "max_grad_norm": 1.0}
    ref_losses, ref_params = reference(opts, world=WORLD, steps=STEPS, micro=MICRO)
    worst_loss = max(
        abs(runs[r][i]["losses"][s][m] - ref_losses[s][r][m]) / abs(ref_losses[s][r][m])
        for r in range(WORLD)
        for s in range(STEPS)
        for m in range(MICRO)
    )
    assert worst_loss < 1e-5, worst_loss
    params = runs[0][i]["params"]
    worst = max(rel_err(params[k], ref_params[k]) for k in ref_params)
    assert worst < 1e-5, worst
    # memory_report counts the fp32 master and each per-element state the type keeps
    states = spec_for(case["optimizer"]).state_names(case["optimizer_params"])
    assert runs[0][i]["states"] == list(states)
    assert runs[0][i]["optim_bytes"] == runs[0][i]["optim_elems"] * 4 * (1 + len(states))
    # the run really trained: parameters moved from their initial values
    init = dict(make_model({}).named_parameters())
    assert max(rel_err(params[k], init[k].detach()) for k in init) > 1e-4


@pytest.mark.parametrize("j", range(len(FP16)), ids=lambda j: FP16[j]["optimizer"])
def test_fp16_overflow_skips_the_step_on_the_host_path(runs, j):
    res = runs[0][len(CASES) + j]
    assert res["skipped"] == [False, True, False]
    assert res["steps"] == STEPS - 1
    assert all(math.isfinite(v) for per in res["losses"] for v in per)
    init = dict(make_model({}).named_parameters())
    assert all(math.isfinite(float(t.abs().sum())) for t in res["params"].values())
    assert max(rel_err(res["params"][k], init[k].detach()) for k in init) > 1e-4
