"""Rank functions for the checkpoint tests: train a tiny NeoX model under a plan and save it, or load a
checkpoint under another plan and save it again (so the two can be compared tensor by tensor)."""

from __future__ import annotations

from typing import Any

CFG_KW = dict(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2, max_position_embeddings=16)


def cfg():
    from zerotopo.models.neox import NeoXConfig

    return NeoXConfig(**CFG_KW)


def checkpoint_worker(
    rank: int,
    world: int,
    out: str,
    plan_name: str,
    nodes: int,
    steps: int,
    load_from: str | None = None,
    fp16: bool = False,
    tokenizer: dict[str, Any] | None = None,
    optimizer: tuple[str, dict[str, Any]] = ("AdamW", {}),
) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from zerotopo.checkpoint.store import load_checkpoint, save_checkpoint
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, parallelize
    from zerotopo.engine.optim import make_scaler
    from zerotopo.models.neox import GPTNeoX
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-4node", nodes=nodes)
    plan = load_plan(plan_name)
    mesh = build_mesh(topo, plan, topo_index=rank)
    torch.manual_seed(0)
    param_dtype = torch.float16 if fp16 else torch.float32
    model = parallelize(GPTNeoX(cfg()), mesh=mesh, mp_policy=MixedPrecision(param_dtype))
    opt = ShardedOptimizer(
        model,
        optimizer[0],
        lr=1e-2,
        weight_decay=0.1,
        loss_scale=make_scaler("dynamic", param_dtype, init_scale=2.0**8, growth_interval=2),
        **(optimizer[1] or {}),
    )
    step = 0
    losses = []
    if load_from:
        step = load_checkpoint(load_from, model, opt, cfg=cfg()).step
    for s in range(step, steps):
        g = torch.Generator().manual_seed(100 * s + rank % 4)
        x = torch.randint(0, CFG_KW["vocab_size"], (2, 9), generator=g)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        model.scale_loss(loss).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    save_checkpoint(
        out,
        model,
        opt,
        step=steps,
        consumed_samples=steps * 2 * world,
        cfg=cfg(),
        plan_name=plan.name,
        tokenizer=tokenizer,
    )
    return {"losses": losses, "scale": model.scaler.state_dict() if model.scaler is not None else None}


def nonfinite_save_worker(rank: int, world: int, out: str) -> str:
    """Build the tiny model under zero3, put one NaN in rank 1's master shard, and try to save: returns
    the error every rank got (nothing may be written)."""
    import torch

    from zerotopo.checkpoint.store import save_checkpoint
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, parallelize
    from zerotopo.errors import ZerotopoError
    from zerotopo.models.neox import GPTNeoX
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("emulated-4node", nodes=world // 2)
    plan = load_plan("zero3")
    torch.manual_seed(0)
    model = parallelize(GPTNeoX(cfg()), mesh=build_mesh(topo, plan, topo_index=rank))
    opt = ShardedOptimizer(model, lr=1e-2)
    if rank == 1:
        opt.master[0][0] = float("nan")
    try:
        save_checkpoint(out, model, opt, step=1, consumed_samples=0, cfg=cfg(), plan_name=plan.name)
    except ZerotopoError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        model.close()
    return "saved"
