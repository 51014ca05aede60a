"""Muon on 8 gloo ranks (zerotopo/engine/muon.py) against single-process ``torch.optim.Muon`` on the layers'
2-D weights plus ``torch.optim.AdamW`` on the rest (the same split), over 5 steps, within 1e-5 relative:
element-sharded plans (zero1, zero3), an optimizer group per node (mics, two groups of owners), the zerotopo
plan's degrees (weights per package, gradients per node, optimizer over the job) and two more planner
candidates; the NeoX model's fused ``query_key_value`` is orthogonalized as stored, as torch's Muon does;
and the quantized zerotopo preset stays within the quantized plans' bound."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.cases import MICRO, STEPS, WORLD, make_model, reference, rel_err, train_worker
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

LR, WD = 2e-2, 0.1
AUX = {"type": "AdamW", "lr": 3e-3, "weight_decay": 0.01, "betas": (0.9, 0.95), "eps": 1e-8}
MUON = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "eps": 1e-7, "aux": AUX}
ZEROTOPO_EXACT = {"quantize_weights": False, "quantize_grads": False, "secondary": None}
EXACT: list[dict[str, Any]] = [
    {"plan": "zero1"},
    {"plan": "zero3"},
    {"plan": "mics", "plan_overrides": {"grad_reduce": "allreduce"}},
    {"plan": "zerotopo", "plan_overrides": ZEROTOPO_EXACT, "name": "zerotopo-degrees"},
    {"plan": {"name": "p2g4o8", "params": 2, "grads": 4, "optim": 8}},
    {"plan": {"name": "p4g4o4-ar", "params": 4, "grads": 4, "optim": 4, "grad_reduce": "allreduce"}},
    {"plan": "zero3", "name": "zero3-neox", "model": "neox"},
    {"plan": "zero1", "name": "zero1-match-rms", "adjust_lr_fn": "match_rms_adamw", "nesterov": False},
]
QUANTIZED = [{"plan": "zerotopo"}]


def _opts(case: dict[str, Any]) -> dict[str, Any]:
    params = {**MUON, "nesterov": case.get("nesterov", True), "adjust_lr_fn": case.get("adjust_lr_fn")}
    return {
        "lr": LR, "weight_decay": WD, "max_grad_norm": 1.0, "model": case.get("model"),
        "optimizer": "Muon", "optimizer_params": params,
    }  # fmt: skip


def _case(case: dict[str, Any]) -> dict[str, Any]:
    from zerotopo.placement.plan import load_plan

    name = case.get("name") or load_plan(case["plan"]).name
    return {**case, "name": name, "opts": _opts(case)}


def is_matrix(name: str, p: torch.Tensor) -> bool:
    """The published split: 2-D weights of the layers (``blocks.`` in the test model, ``layers.`` in NeoX)."""
    return p.ndim == 2 and name.split(".")[0] in ("blocks", "layers")


class MuonAndAdamW:
    """torch's Muon on the matrices and AdamW on the rest, stepped together (the single-process reference)."""

    def __init__(self, model: torch.nn.Module, opts: dict[str, Any]) -> None:
        named = list(model.named_parameters())
        mats = [p for n, p in named if is_matrix(n, p)]
        decay = [p for n, p in named if not is_matrix(n, p) and p.ndim >= 2]
        no_decay = [p for n, p in named if p.ndim < 2]
        m = opts["optimizer_params"]
        self.opts = [
            torch.optim.Muon(
                mats, lr=LR, weight_decay=WD, momentum=m["momentum"], nesterov=m["nesterov"], eps=m["eps"],
                ns_steps=m["ns_steps"], adjust_lr_fn=m["adjust_lr_fn"],
            ),
            torch.optim.AdamW(
                [{"params": decay, "weight_decay": AUX["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                lr=AUX["lr"], betas=AUX["betas"], eps=AUX["eps"], foreach=False,
            ),
        ]  # fmt: skip

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad()


@pytest.fixture(scope="module")
def runs():
    cases = [_case(c) for c in (*EXACT, *QUANTIZED)]
    return cases, spawn(train_worker, WORLD, args=(cases,), ranks_per_node=4, timeout_s=1800)


def _compare(case: dict[str, Any], results: list) -> tuple[float, float]:
    i = next(k for k, r in enumerate(results[0]) if r["name"] == case["name"])
    opts = {**case["opts"], "make_optimizer": lambda model: MuonAndAdamW(model, case["opts"])}
    ref_losses, ref_params = reference(opts)
    loss_err = max(
        abs(results[r][i]["losses"][s][m] - ref_losses[s][r][m]) / abs(ref_losses[s][r][m])
        for r in range(WORLD)
        for s in range(STEPS)
        for m in range(MICRO)
    )
    params = results[0][i]["params"]
    param_err = max(rel_err(params[k], ref_params[k]) for k in ref_params)
    init = dict(make_model(case["opts"]).named_parameters())
    assert max(rel_err(params[k], init[k].detach()) for k in init) > 1e-3  # it trained
    return loss_err, param_err


@pytest.mark.parametrize("j", range(len(EXACT)), ids=lambda j: _case(EXACT[j])["name"])
def test_muon_equals_torch_muon_plus_adamw(runs, j):
    cases, results = runs
    loss_err, param_err = _compare(cases[j], results)
    assert loss_err < 1e-5 and param_err < 1e-5, (cases[j]["name"], loss_err, param_err)


def test_quantized_zerotopo_preset_stays_within_the_quantized_bound(runs):
    cases, results = runs
    loss_err, param_err = _compare(cases[len(EXACT)], results)
    assert loss_err < 1e-2 and param_err < 5e-2, (loss_err, param_err)
