"""Shard-only start-up: a model built on the meta device is materialized unit by unit, each rank keeps
only its slices, and the values equal an eager build with the same seed (4 gloo ranks, one spawn)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.cases import MICRO, TinyLM, batch, loss_fn
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

WORLD = 4
# p == 1 (every rank keeps full units), p == 2 with an int8 secondary, p == world
CASES = [("_neox", "zero1"), ("_neox", "zerotopo"), ("_tiny", "zero3")]
# gradients reduce-scattered over 2 ranks, then reduce-scattered into the optimizer chunk across them
GRAD_PLAN = {"params": 2, "grads": 2, "optim": 4}


def _neox(meta: bool):
    from zerotopo.models.neox import GPTNeoX, NeoXConfig

    cfg = NeoXConfig(vocab_size=37, hidden_size=16, num_layers=3, num_attention_heads=2)
    torch.manual_seed(7)
    if meta:
        with torch.device("meta"):
            return GPTNeoX(cfg)
    return GPTNeoX(cfg)


def _tiny(meta: bool):
    if meta:
        with torch.device("meta"):
            return TinyLM(layers=2, seed=3)
    return TinyLM(layers=2, seed=3)


def _worker(rank: int, world: int) -> list[dict[str, Any]]:
    from zerotopo.comm.ledger import Ledger
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug, parallelize
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated", nodes=1)
    out = []
    for build_name, spec in CASES:
        build = globals()[build_name]
        plan = load_plan(spec)
        res: dict[str, Any] = {"model": build.__name__, "plan": plan.name}
        for meta in (False, True):
            model = build(meta)
            assert all(p.is_meta for p in model.parameters()) == meta
            seen_full: list[int] = []
            units_built: list[torch.nn.Module] = []
            default_init = getattr(model, "init_unit", None)

            def init(m, model=model, units_built=units_built, seen_full=seen_full, default_init=default_init):
                # how many earlier units still hold storage when this one is materialized
                seen_full.append(
                    sum(1 for u in units_built if any(p.untyped_storage().size() > 0 for p in u.parameters()))
                )
                units_built.append(m)
                if default_init is not None:
                    default_init(m)
                else:
                    from zerotopo.engine.units import reset_by_modules

                    reset_by_modules(m)

            mesh = build_mesh(topo, plan, topo_index=rank)
            sm = parallelize(model, mesh=mesh, init=init if meta else None)
            opt = ShardedOptimizer(sm, lr=1e-2)
            sd = sm.full_state_dict()
            losses = []
            for s in range(2):
                for m in range(MICRO):
                    x, y = batch(s, rank, m)
                    loss = loss_fn(sm(x), y) / MICRO
                    sm.scale_loss(loss).backward()
                    losses.append(loss.item())
                opt.step()
                opt.zero_grad()
            key = "meta" if meta else "eager"
            final = sm.full_state_dict()  # collective: every rank calls it
            res[key] = {
                "init": sd if rank == 0 else None,
                "losses": losses,
                "final": final if rank == 0 else None,
                "seen_full": seen_full,
                "sharded": all(u.sharded for u in sm.units),
                "memory": sm.memory_report(),
            }
            sm.close()
        out.append(res)
    # grad_dtype: gradient shards and every gradient reduction in bf16 ("param") or fp32, built on meta
    for grad_dtype in ("fp32", "param"):
        plan = load_plan({"name": f"p2g2o4-{grad_dtype}", **GRAD_PLAN, "grad_dtype": grad_dtype})
        ledger = Ledger()
        sm = debug.parallelize(
            _neox(True), mesh=build_mesh(topo, plan, topo_index=rank),
            mp_policy=MixedPrecision(torch.bfloat16), options=debug.DebugOptions(ledger=ledger),
        )  # fmt: skip
        opt = ShardedOptimizer(sm, lr=1e-2)
        losses = []
        for s in range(2):
            if s == 1:
                ledger.reset()
            for m in range(MICRO):
                x, y = batch(s, rank, m)
                loss = loss_fn(sm(x), y) / MICRO
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        out.append(
            {
                "grad_dtype": grad_dtype,
                "shard_dtypes": sorted({str(u.grad_shard.dtype) for u in sm.units}),
                "memory": sm.memory_report(),
                "ledger": {(op, tier or ""): b for (op, tier), b in ledger.bytes_by_op().items() if b},
                "unit_numels": sm.unit_numels(),
                "losses": losses,
            }
        )
        sm.close()
    return out


@pytest.fixture(scope="module")
def runs():
    return spawn(_worker, WORLD, ranks_per_node=4, timeout_s=600)


def test_meta_build_equals_eager_build(runs):
    for res in runs[0][: len(CASES)]:
        eager, meta = res["eager"], res["meta"]
        assert eager["init"].keys() == meta["init"].keys()
        for k, v in eager["init"].items():
            assert torch.equal(v, meta["init"][k]), (res["model"], res["plan"], k)
        for k, v in eager["final"].items():
            assert torch.equal(v, meta["final"][k]), (res["model"], res["plan"], k)
    for r in range(WORLD):
        for res in runs[r][: len(CASES)]:
            assert res["eager"]["losses"] == res["meta"]["losses"], (r, res["model"], res["plan"])
            assert res["eager"]["memory"] == res["meta"]["memory"]


def test_one_full_unit_at_a_time(runs):
    for r in range(WORLD):
        for res in runs[r][: len(CASES)]:
            seen = res["meta"]["seen_full"]
            assert len(seen) >= 3
            if res["meta"]["sharded"]:
                # every earlier unit dropped its full buffer before the next was materialized
                assert seen == [0] * len(seen), (res["model"], res["plan"], seen)
            else:
                # params == 1: each rank's shard is the full unit, kept (what the plan asks for)
                assert seen == list(range(len(seen)))


def test_meta_parameters_without_an_init_are_refused():
    from zerotopo.engine.units import reset_by_modules
    from zerotopo.errors import ZerotopoError

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(3, 3), Scale())
    with pytest.raises(ZerotopoError, match=r"'1\.w'.*init_unit"):
        reset_by_modules(m)


def test_grad_dtype_param_keeps_gradients_in_the_parameter_dtype(runs):
    from zerotopo.cost.comm import bytes_by_op_tier, comm_per_step
    from zerotopo.cost.memory import memory_per_device
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated", nodes=1)
    for r in range(WORLD):
        fp32, half = runs[r][len(CASES) :]
        assert fp32["shard_dtypes"] == ["torch.float32"] and half["shard_dtypes"] == ["torch.bfloat16"]
        assert fp32["memory"]["grads"] == 2 * half["memory"]["grads"] > 0
        for res in (fp32, half):
            plan = load_plan({**GRAD_PLAN, "grad_dtype": res["grad_dtype"]})
            # the ledger's bytes and the engine's memory are the cost model's, widths from the plan
            want = bytes_by_op_tier(comm_per_step(res["unit_numels"], topo, plan, micro_batches=MICRO))
            assert res["ledger"] == {k: v for k, v in want.items() if v}, (r, res["grad_dtype"])
            mem = memory_per_device(res["unit_numels"], topo, plan, param_bytes=2)
            assert res["memory"]["grads"] == mem.grads
        # bf16 gradients train like fp32 ones over two steps (bf16 rounding: ~1e-2 relative)
        for a, b in zip(fp32["losses"], half["losses"]):
            assert abs(a - b) <= 2e-2 * abs(a)
        assert fp32["losses"] != half["losses"]  # the reduction really ran in bf16
