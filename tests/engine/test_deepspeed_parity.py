"""DeepSpeed ZeRO-3 as an outside reference: same tiny model, data, seed and AdamW, fp32, gloo, 4 ranks;
zerotopo's ``zero3`` gives the same losses (within 1e-5 relative)."""

from __future__ import annotations

import pytest

from tests.engine.cases import MICRO, STEPS, TinyLM, batch, loss_fn

pytestmark = pytest.mark.slow
RANKS = 4
LR = 1e-2


def _adamw(model):
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False,
    )  # fmt: skip


def _deepspeed_losses(rank: int) -> list[float]:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    model = TinyLM()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": MICRO,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=_adamw(model), config=config, dist_init_required=False
    )
    losses = []
    for s in range(STEPS):
        for m in range(MICRO):
            x, y = batch(s, rank, m)
            loss = loss_fn(engine(x), y)
            engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps
            engine.step()
            losses.append(loss.item())
    return losses


def _zerotopo_losses(rank: int) -> list[float]:
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated", nodes=1), get_preset("zero3"), topo_index=rank)
    model = debug.parallelize(TinyLM(), mesh=mesh, options=debug.DebugOptions(sanitize=True))
    optimizer = ShardedOptimizer(model, lr=LR, weight_decay=0.1)
    losses = []
    for s in range(STEPS):
        for m in range(MICRO):
            x, y = batch(s, rank, m)
            loss = loss_fn(model(x), y)
            (loss / MICRO).backward()
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return losses


def _worker(rank: int, world: int) -> tuple[list[float], list[float]]:
    return _zerotopo_losses(rank), _deepspeed_losses(rank)


def test_zero3_matches_deepspeed_zero3():
    pytest.importorskip("deepspeed")
    from zerotopo.launch.spawn import spawn

    results = spawn(_worker, RANKS, ranks_per_node=RANKS, timeout_s=900, env={"DS_ACCELERATOR": "cpu"})
    for rank, (ours, theirs) in enumerate(results):
        assert len(ours) == len(theirs) == STEPS * MICRO
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= 1e-5 * abs(b), (rank, ours, theirs)
