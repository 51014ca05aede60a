"""Muon on 8 gloo ranks (zerotopo/engine/muon.py) against single-process ``torch.optim.Muon`` on the layers'
2-D weights plus ``torch.optim.AdamW`` on the rest (the same split), over 5 steps, within 1e-5 relative.
The reference sums each step's gradients in the plan's reduction order (tests/engine/ordered_reduction.py,
[Note: the reference sums in the plan's order]) for the element-sharded plans (zero1, zero3) and the two
plans with two optimizer groups of 4 owners (mics, p4g4o4); that this order and the plain loop's agree to
fp32 rounding is a test of its own, and so is what bf16 Newton-Schulz makes of that rounding. The zerotopo
plan's degrees (p=2 g=4 o=8) are compared with the loop-order reference, exactly for 3 steps and within
the bf16 bound after (see [Note: p=2 g=4 o=8 departs from the plan-order reference at step 4]). The NeoX
model's fused ``query_key_value`` is orthogonalized as stored, as torch's Muon does; and the quantized
zerotopo preset stays within the quantized plans' bound."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.cases import (
    MICRO,
    STEPS,
    WORLD,
    batch,
    loss_fn,
    make_model,
    reference,
    rel_err,
    train_worker,
)
from tests.engine.ordered_reduction import ordered_reference
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

LR, WD = 2e-2, 0.1
AUX = {"type": "AdamW", "lr": 3e-3, "weight_decay": 0.01, "betas": (0.9, 0.95), "eps": 1e-8}
MUON = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "eps": 1e-7, "aux": AUX}
ZEROTOPO_EXACT = {"quantize_weights": False, "quantize_grads": False, "secondary": None}
MICS = {"plan": "mics", "plan_overrides": {"grad_reduce": "allreduce"}}
P4G4O4 = {"plan": {"name": "p4g4o4-ar", "params": 4, "grads": 4, "optim": 4, "grad_reduce": "allreduce"}}
# Within 1e-5 over 5 steps of the reference that sums the gradients in the plan's order.
EXACT: list[dict[str, Any]] = [
    {"plan": "zero1"},
    {"plan": "zero3"},
    {"plan": "zero1", "name": "zero1-match-rms", "adjust_lr_fn": "match_rms_adamw", "nesterov": False},
    # two optimizer groups of 4 owners each
    MICS,
    P4G4O4,
]
# [Note: bf16 Newton-Schulz amplifies reduction order] torch's Muon orthogonalizes in bf16, so a gradient
# that differs in the last fp32 bits (another summation order of the same reduction) can round to another
# bf16 value, and every Newton-Schulz product then rounds differently: single-process torch Muon given
# gradients perturbed by 1e-6 relative ends 5 steps ~4e-3 (relative) away
# (test_single_process_muon_amplifies_gradient_rounding). Against a reference that sums the ranks'
# gradients in its loop's order instead of the plan's, these two plans' reductions cross such a rounding
# boundary at step 4: losses stay within 1e-4 and parameters within 1e-2, as for that perturbation.
SENSITIVE = [MICS, P4G4O4]
BF16_BOUND = (1e-4, 1e-2)  # largest relative loss and parameter differences that rounding moves Muon by
# [Note: p=2 g=4 o=8 departs from the plan-order reference at step 4] The zerotopo plan's degrees
# (weights per package, gradients per node, optimizer over the job) against the plan-order reference:
# losses bitwise equal for 3 steps and step-1 reduced gradients bitwise equal to the replay, yet the loss
# of step 4 differs by 2.4e-7 and the parameters end 1.4e-3 apart: something besides the gradient sum (not
# located yet) rounds differently once in those steps, and bf16 Newton-Schulz amplifies it. Against the
# loop-order reference they matched within 1e-5 over 5 steps on an AMD EPYC CPU and ended 1.4e-3 apart on
# an Intel Xeon with AVX-512 (loss 9.5e-6): which reference they land on depends on the CPU's kernels. So
# their losses are held to 1e-5 for the 3 steps before that rounding, and all 5 steps to BF16_BOUND, the
# bound of [Note: bf16 Newton-Schulz amplifies reduction order].
LOOP_ORDER: list[dict[str, Any]] = [
    {"plan": "zerotopo", "plan_overrides": ZEROTOPO_EXACT, "name": "zerotopo-degrees"},
    {"plan": {"name": "p2g4o8", "params": 2, "grads": 4, "optim": 8}},
]
# The NeoX model: the fused query_key_value is orthogonalized as stored, one matrix, as torch's Muon does;
# against the plan-order reference the matrices are within 1e-5 over 3 steps (measured: equal) and the
# key bias, whose exact gradient is zero, takes AdamW steps on rounding noise (3e-5, as under AdamW alone).
# Against the loop-order reference the matrices end 3e-3 apart ([Note: bf16 Newton-Schulz amplifies
# reduction order]), so the comparison is with the plan's order.
NEOX = [{"plan": "zero3", "name": "zero3-neox", "model": "neox", "steps": 3}]
QUANTIZED = [{"plan": "zerotopo"}]
ALL = [*EXACT, *LOOP_ORDER, *NEOX, *QUANTIZED]  # SENSITIVE's plans are among EXACT's: one run each


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
    cases = [_case(c) for c in ALL]
    return cases, spawn(train_worker, WORLD, args=(cases,), ranks_per_node=4, timeout_s=1800)


def _degrees(case: dict[str, Any]) -> tuple[Any, str]:
    """The case's plan resolved on the emulated topology, and its ``grad_reduce``."""
    from dataclasses import replace

    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    plan = replace(load_plan(case["plan"]), **case.get("plan_overrides", {}))
    return plan.degrees(load_topology("emulated")), plan.grad_reduce


def _plan_order_reference(case: dict[str, Any], steps: int) -> tuple[list, dict[str, torch.Tensor], list]:
    """The single-process reference with each step's gradients summed in ``case``'s plan order."""
    model = make_model({**case["opts"], "meta": False})
    d, grad_reduce = _degrees(case)
    return ordered_reference(
        model, MuonAndAdamW(model, case["opts"]), d, grad_reduce, steps=steps, micro=MICRO, batch=batch,
        loss_fn=loss_fn, max_grad_norm=case["opts"]["max_grad_norm"],
    )  # fmt: skip


def _compare(
    case: dict[str, Any],
    results: list,
    keep=lambda name, t: True,
    *,
    plan_order: bool = True,
    loss_steps: int | None = None,
) -> tuple[float, float]:
    """Largest relative loss and parameter differences from the reference: by default the one that sums
    the gradients in the plan's order; ``plan_order=False``: the plain loop over ranks and micro-batches.
    ``loss_steps``: compare the losses of the first that many steps only (the parameters: after all)."""
    i = next(k for k, r in enumerate(results[0]) if r["name"] == case["name"])
    steps = case.get("steps", STEPS)
    if plan_order:
        ref_losses, ref_params, _ = _plan_order_reference(case, steps)
    else:
        opts = {**case["opts"], "make_optimizer": lambda model: MuonAndAdamW(model, case["opts"])}
        ref_losses, ref_params = reference(opts, steps=steps)
    loss_err = max(
        abs(results[r][i]["losses"][s][m] - ref_losses[s][r][m]) / abs(ref_losses[s][r][m])
        for r in range(WORLD)
        for s in range(loss_steps or steps)
        for m in range(MICRO)
    )
    params = results[0][i]["params"]
    param_err = max(rel_err(params[k], ref_params[k]) for k in ref_params if keep(k, ref_params[k]))
    init = dict(make_model(case["opts"]).named_parameters())
    assert max(rel_err(params[k], init[k].detach()) for k in init) > 1e-3  # it trained
    return loss_err, param_err


def _named(case: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in (_case(x) for x in ALL) if c["name"] == _case(case)["name"])


@pytest.mark.parametrize("case", EXACT, ids=lambda c: _case(c)["name"])
def test_muon_equals_torch_muon_plus_adamw(runs, case):
    loss_err, param_err = _compare(_named(case), runs[1])
    assert loss_err < 1e-5 and param_err < 1e-5, (case, loss_err, param_err)


@pytest.mark.parametrize("case", LOOP_ORDER, ids=lambda c: _case(c)["name"])
def test_zerotopo_degrees_match_the_loop_order_for_three_steps(runs, case):
    early, _ = _compare(_named(case), runs[1], plan_order=False, loss_steps=3)
    assert early < 1e-5, (case, early)


@pytest.mark.parametrize("case", [*EXACT, *LOOP_ORDER], ids=lambda c: _case(c)["name"])
def test_plan_order_sum_equals_the_loop_sum_to_fp32_rounding(case):
    """The reference's reordering changes each step's gradient by fp32 rounding only (single process)."""
    _, _, seen = _plan_order_reference(_case(case), STEPS)
    for step in seen:
        worst = max(rel_err(step["ordered"][k], step["loop"][k]) for k in step["loop"])
        assert worst < 1e-6, (case, worst)
    # and the orders do differ: the exact comparison above is not the loop's reference by another name
    assert any(not torch.equal(step["ordered"][k], step["loop"][k]) for step in seen for k in step["loop"])


@pytest.mark.parametrize("case", [*SENSITIVE, *LOOP_ORDER], ids=lambda c: _case(c)["name"])
def test_against_the_loop_order_stay_within_bf16_sensitivity(runs, case):
    """Two optimizer groups of 4 owners, and the zerotopo plan's degrees over all 5 steps."""
    loss_err, param_err = _compare(_named(case), runs[1], plan_order=False)
    assert loss_err < BF16_BOUND[0] and param_err < BF16_BOUND[1], (case, loss_err, param_err)


def test_fused_qkv_is_orthogonalized_as_stored(runs):
    case = _named(NEOX[0])
    loss_err, param_err = _compare(case, runs[1], keep=is_matrix)
    assert loss_err < 1e-5 and param_err < 1e-5, (loss_err, param_err)
    # the reference runs Muon on the stored (3h, h) query_key_value as one matrix, so equality at 1e-5
    # means the engine orthogonalized it as stored too (orthogonalized per logical q, k, v block it differs at order 1)


def test_quantized_zerotopo_preset_stays_within_the_quantized_loss_bound(runs):
    # int4 gradients: Muon's orthogonalized update gives the quantization noise full-size steps, so the
    # parameters drift from the fp32 reference (measured ~0.6 relative after 5 steps at lr 2e-2) while
    # the losses stay within the quantized plans' 1e-2
    loss_err, _ = _compare(_named(QUANTIZED[0]), runs[1], plan_order=False)  # int4: no fp32 order to replay
    assert loss_err < 1e-2, loss_err


def test_single_process_muon_amplifies_gradient_rounding():
    """The sensitivity the SENSITIVE bound rests on: torch's Muon alone, gradients perturbed by 1e-6."""
    opts = _case(EXACT[0])["opts"]
    torch.manual_seed(1)

    def run(noise: float) -> dict[str, torch.Tensor]:
        from tests.engine.cases import batch, loss_fn

        model = make_model(opts)
        opt = MuonAndAdamW(model, opts)
        for s in range(STEPS):
            for r in range(WORLD):
                for m in range(MICRO):
                    x, y = batch(s, r, m)
                    (loss_fn(model(x), y) / MICRO).backward()
            for p in model.parameters():
                p.grad.mul_(1 / WORLD + noise * torch.randn_like(p.grad))
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
            opt.step()
            opt.zero_grad()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    a, b = run(0.0), run(1e-6 / WORLD)
    assert 1e-4 < max(rel_err(a[k], b[k]) for k in a) < 1e-2
