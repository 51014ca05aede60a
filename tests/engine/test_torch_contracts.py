"""The library speaks torch's contracts: ``parallelize`` shards the module in place and returns it,
the sharded optimizer is a ``torch.optim.Optimizer`` that torch's ``LambdaLR`` drives step for step
along GPT-NeoX's schedule, and its ``state_dict`` / ``load_state_dict`` (with the scheduler's) replay a
run bit for bit. 4 gloo ranks under ``zero3``."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from tests.engine.cases import MICRO, batch, loss_fn, make_model
from zerotopo.engine import MixedPrecision, ShardedModule, ShardedOptimizer, parallelize
from zerotopo.errors import ZerotopoError
from zerotopo.trainer.lr_schedule import LRSchedule, ScheduleLR

RANKS = 4
STEPS = 6
PEAK = 1e-2
# GPT-NeoX's schedule: linear warmup over 2 steps, then cosine decay to min_lr at step 5
NEOX = LRSchedule.from_args(lr=PEAK, min_lr=1e-3, warmup=0.4, decay_iters=5, style="cosine")


def _build(rank: int):
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated", nodes=1), get_preset("zero3"), topo_index=rank)
    module = make_model({})
    model = parallelize(module, mesh=mesh, mp_policy=MixedPrecision(torch.float32))
    optimizer = ShardedOptimizer(model, torch.optim.AdamW, lr=PEAK, betas=(0.9, 0.95), weight_decay=0.1)
    return module, model, optimizer


def _train_step(model, optimizer, rank: int, s: int) -> list[float]:
    losses = []
    for m in range(MICRO):
        x, y = batch(s, rank, m)
        loss = loss_fn(model(x), y)
        model.set_is_last_backward(m == MICRO - 1)
        (loss / MICRO).backward()
        losses.append(loss.item())
    optimizer.step()
    optimizer.zero_grad()
    return losses


def _worker(rank: int, world: int) -> dict:
    out: dict = {}
    # 1. LambdaLR drives the rate; the run is the trainer's (ScheduleLR: NeoX's values set exactly).
    module, model, optimizer = _build(rank)
    out["same_module"] = model is module and isinstance(model, ShardedModule)
    out["is_optimizer"] = isinstance(optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: NEOX(k) / PEAK)
    out["lambda_lrs"], out["lambda_losses"] = [], []
    for s in range(STEPS):
        out["lambda_lrs"].append(float(optimizer.param_groups[0]["lr"]))
        out["lambda_losses"] += _train_step(model, optimizer, rank, s)
        scheduler.step()
    out["lambda_final"] = model.full_state_dict()
    model.close()

    _, model, optimizer = _build(rank)
    scheduler = ScheduleLR(optimizer, NEOX)
    out["neox_losses"] = []
    for s in range(STEPS):
        out["neox_losses"] += _train_step(model, optimizer, rank, s)
        scheduler.step()
    out["neox_final"] = model.full_state_dict()
    model.close()

    # 2. torch's state-dict contract: save optimizer and scheduler after step 2, reload, replay.
    _, model, optimizer = _build(rank)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: NEOX(k) / PEAK)
    for s in range(2):
        _train_step(model, optimizer, rank, s)
        scheduler.step()
    sd = optimizer.state_dict()
    out["sd_keys"] = sorted(sd)
    out["sd_params"] = sd["param_groups"][0]["params"]
    out["sd_units"] = len(sd["state"])
    saved = (model.full_state_dict(), copy.deepcopy(sd), scheduler.state_dict())

    def run_on() -> list[float]:
        losses = []
        for s in range(2, STEPS):
            losses += _train_step(model, optimizer, rank, s)
            scheduler.step()
        return losses

    first = run_on()
    model.load_full_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    scheduler.load_state_dict(saved[2])
    out["replayed"] = first == run_on()
    try:
        ShardedOptimizer(model, lr=1.0)
    except ZerotopoError as exc:
        out["second_optimizer"] = str(exc)
    model.close()
    return out


@pytest.mark.slow
def test_lambdalr_drives_the_sharded_optimizer_along_neox_schedule():
    from zerotopo.launch.spawn import spawn

    results = spawn(_worker, RANKS, ranks_per_node=RANKS, timeout_s=900)
    for rank, res in enumerate(results):
        assert res["same_module"] and res["is_optimizer"], rank
        # LambdaLR's rate is NeoX's at every step (to the rounding of peak * (lr / peak))
        assert res["lambda_lrs"] == pytest.approx([NEOX(k) for k in range(STEPS)], rel=1e-12, abs=0), rank
        assert res["lambda_lrs"][0] == pytest.approx(PEAK / 2)  # warmup
        for a, b in zip(res["lambda_losses"], res["neox_losses"]):
            assert abs(a - b) <= 1e-6 * abs(b), rank
        for name, t in res["neox_final"].items():
            torch.testing.assert_close(res["lambda_final"][name], t, rtol=1e-5, atol=1e-7)
        assert res["sd_keys"] == ["loss_scaler", "optimizer", "param_groups", "scalars", "state"]
        assert res["sd_params"] == list(range(res["sd_units"]))
        assert res["replayed"], rank
        assert "already has a ShardedOptimizer" in res["second_optimizer"]


def test_parallelize_takes_at_most_six_parameters_and_refuses_a_plain_module_for_the_optimizer():
    assert len(inspect.signature(parallelize).parameters) <= 6
    with pytest.raises(ZerotopoError, match="sharded by zerotopo.engine.parallelize"):
        ShardedOptimizer(torch.nn.Linear(2, 2), lr=1e-3)
    with pytest.raises(ZerotopoError, match="pass torch.optim.AdamW"):
        from zerotopo.engine.optim import _optimizer_name

        _optimizer_name(torch.optim.Adam)


def test_parallelize_refuses_a_model_whose_names_the_sharded_module_uses():
    from types import SimpleNamespace

    class HasUnits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.units = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    mesh = SimpleNamespace(plan=SimpleNamespace(grad_dtype=None))  # refused before the mesh is used
    with pytest.raises(ZerotopoError, match="HasUnits defines units"):
        parallelize(HasUnits(), mesh=mesh)
