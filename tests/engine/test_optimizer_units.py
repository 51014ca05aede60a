"""The sharded optimizer's update rules for every type of the table, on one unit's flat chunk in one
process (no mesh): torch's class on views of the flat master and state buffers equals the same class on
the module's own parameters; fused kernels skip a flagged fp16 step bit for bit; a state written by
another type is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.shard_steps import grads, one_unit, step_both
from zerotopo.config.optimizers import SPECS
from zerotopo.engine.optim import ShardedOptimizer, _fused_supported, resolve_optimizer
from zerotopo.errors import ZerotopoError

# Hyperparameters that switch every state of each type on (momentum buffers, centered, amsgrad).
HYPER: dict[str, dict[str, Any]] = {
    "AdamW": {"amsgrad": True},
    "SGD": {"momentum": 0.9, "dampening": 0.3},
    "Adagrad": {"lr_decay": 0.01, "initial_accumulator_value": 0.2},
    "Adadelta": {"rho": 0.8},
    "RMSprop": {"momentum": 0.5, "centered": True},
    "Adamax": {},
    "NAdam": {"momentum_decay": 4e-3},
    "RAdam": {"decoupled_weight_decay": True},
}
LR, WD = 3e-3, 0.1


def _bare(name: str, hyper: dict[str, Any], fused: bool, frozen: bool = True):
    """A ShardedOptimizer over one unit's optimizer chunk (world 1), built without a mesh; the unit's
    module is a Linear (decayed) and a LayerNorm (not decayed, its weight frozen with ``frozen``)."""
    u, mod = one_unit(frozen)
    opt = object.__new__(ShardedOptimizer)
    opt.spec, full = resolve_optimizer(name, hyper)
    opt.param_groups = [{"lr": LR, **full, "weight_decay": WD, "params": []}]
    opt.master = [u.initial_master]
    opt.states = {
        n: [torch.full_like(u.initial_master, opt.spec.initial_value(n, full))]
        for n in opt.spec.state_names(full)
    }
    opt.frozen_runs = [u.runs(lambda s: not s.trainable)]
    opt.fused = fused
    opt._host_steps = 0
    opt.pieces = [[]]
    opt.optims = [opt._torch_optimizer(0, u)]
    return opt, u, mod, full


def _cases():
    for name in HYPER:
        for fused in (False, True):
            if not fused or _fused_supported(torch.device("cpu"), SPECS[name.lower()]):
                yield pytest.param(name, fused, id=f"{name}-{'fused' if fused else 'foreach'}")


@pytest.mark.parametrize("name, fused", list(_cases()))
def test_flat_shard_update_is_torchs_own(name, fused):
    opt, u, mod, full = _bare(name, HYPER[name], fused)
    ref_params = [p.detach().clone() for p in mod.parameters()]
    trainable = [p.requires_grad for p in mod.parameters()]
    decay = [r for r, t, p in zip(ref_params, trainable, mod.parameters()) if t and p.ndim >= 2]
    no_decay = [r for r, t, p in zip(ref_params, trainable, mod.parameters()) if t and p.ndim < 2]
    cls = getattr(torch.optim, opt.spec.torch_class)
    ref = cls(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, foreach=False, **full,
    )  # fmt: skip
    step_both(opt, u, ref, ref_params, range(1, 4))
    for s, r, t, p in zip(u.slots, ref_params, trainable, mod.parameters()):
        got = opt.master[0][s.offset : s.offset + s.numel].view(s.shape)
        if not t:
            assert torch.equal(got, p.detach())
            for n, bufs in opt.states.items():  # a frozen parameter keeps the state's initial value
                assert torch.all(bufs[0][s.offset : s.offset + s.numel] == opt.spec.initial_value(n, full))
            continue
        torch.testing.assert_close(got, r, rtol=1e-6, atol=1e-7)
        for n, bufs in opt.states.items():  # the flat buffers are torch's state
            want = ref.state[r][n]
            torch.testing.assert_close(bufs[0][s.offset : s.offset + s.numel].view(s.shape), want)
    assert not opt.master[0][u.numel :].any()  # the padding stays zero
    assert set(opt.states) == set(opt.spec.state_names(full)) == {n for n, _ in opt.spec.states}


@pytest.mark.parametrize("name", ["SGD", "Adagrad"])
def test_fused_kernels_skip_a_flagged_step_bit_for_bit(name):
    """fp16 on a device with a fused kernel passes the overflow flag as ``found_inf``: a flagged step
    leaves master, states and step counts as they were."""
    opt, u, _, _ = _bare(name, {k: v for k, v in HYPER[name].items() if k != "dampening"}, True)
    for step in range(1, 3):
        opt._host_steps += 1
        opt._apply(0, grads(u, step), torch.zeros(()))
    before = [opt.master[0].clone(), *(b[0].clone() for b in opt.states.values())]
    steps = [st.get("step") for st in opt.optims[0].state.values()]
    opt._apply(0, torch.zeros(u.padded), torch.ones(()))
    after = [opt.master[0], *(b[0] for b in opt.states.values())]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert [st.get("step") for st in opt.optims[0].state.values()] == steps


def _unit_sd(opt, u, kind: str) -> dict[str, Any]:
    sd = {
        "step": 2, "optimizer": kind, "scalars": {}, "param_groups": [dict(opt.param_groups[0])],
        "loss_scaler": None,
        "units": {"u": {"range": u.o_range, "master": opt.master[0].clone(),
                        **{n: b[0].clone() for n, b in opt.states.items()}}},
    }  # fmt: skip
    sd["param_groups"][0].pop("params")
    return sd


def test_state_of_another_type_is_refused_naming_both():
    opt, u, _, _ = _bare("RMSprop", {"momentum": 0.5}, False)
    opt.units = [u]
    with pytest.raises(ZerotopoError, match="written by SGD, this run's optimizer is RMSprop"):
        opt.load_state_dict(_unit_sd(opt, u, "SGD"))
    sd = _unit_sd(opt, u, "RMSprop")
    del sd["units"]["u"]["momentum_buffer"]
    with pytest.raises(ZerotopoError, match="has no momentum_buffer"):
        opt.load_state_dict(sd)


def test_unknown_type_and_hyperparameter_are_refused_before_anything_is_built():
    with pytest.raises(ZerotopoError, match="optimizer 'LBFGS': LBFGS keeps whole-model history"):
        resolve_optimizer("LBFGS", None)
    with pytest.raises(ZerotopoError, match="SGD: betas: SGD takes no 'betas'"):
        resolve_optimizer("sgd", None, betas=(0.9, 0.99))
    with pytest.raises(ZerotopoError, match=r"momentum: expected a number in \[0.0, 1.0\]"):
        resolve_optimizer("RMSprop", {"momentum": -0.1})
    spec, hyper = resolve_optimizer("adam", None)
    assert spec.name == "AdamW" and hyper == {"betas": (0.9, 0.95), "eps": 1e-8}


def test_scalar_state_carries_over_a_restart():
    """NAdam's ``mu_product`` (one scalar every element shares) read from a run and set on a fresh
    optimizer at the same step continues as torch's own optimizer does."""
    opt, u, mod, full = _bare("NAdam", HYPER["NAdam"], False, frozen=False)
    ref_params = [p.detach().clone() for p in mod.parameters()]
    ref = torch.optim.NAdam(ref_params, lr=LR, foreach=False, **full)  # no decay here: WD 0 below
    opt.param_groups[0]["weight_decay"] = 0.0
    step_both(opt, u, ref, ref_params, range(1, 3))
    saved = opt.scalar_state()
    assert saved["mu_product"] == pytest.approx(float(ref.state[ref_params[0]]["mu_product"]), rel=1e-7)
    fresh, _, _, _ = _bare("NAdam", HYPER["NAdam"], False, frozen=False)
    fresh.param_groups[0]["weight_decay"] = 0.0
    fresh.master[0].copy_(opt.master[0])
    for name, bufs in opt.states.items():
        fresh.states[name][0].copy_(bufs[0])
    fresh._host_steps = 2
    fresh._bind_states(0, fresh.optims[0])
    assert fresh.scalar_state() == {"mu_product": 1.0}  # fresh until set
    fresh._set_scalars(saved)
    grad = grads(u, 3)
    fresh._host_steps += 1
    fresh._apply(0, grad.clone())
    for s, r in zip(u.slots, ref_params):
        r.grad = grad[s.offset : s.offset + s.numel].view(s.shape).clone()
    ref.step()
    for s, r in zip(u.slots, ref_params):
        torch.testing.assert_close(fresh.master[0][s.offset : s.offset + s.numel].view(s.shape), r)
