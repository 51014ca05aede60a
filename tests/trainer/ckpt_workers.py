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


def settle_count_worker(
    rank: int, world: int, out: str, optimizer: tuple[str, dict[str, Any]]
) -> dict[str, Any]:
    """Train two steps under zero3 and save; load that checkpoint into a second model built from another
    seed, counting the optimizer's settles (its ``load_state_dict`` calls) during the load; then take one
    more step on both and report whether their master weights and states agree bit for bit."""
    import torch
    import torch.nn.functional as F

    from zerotopo.checkpoint.store import load_checkpoint, save_checkpoint
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, parallelize
    from zerotopo.models.neox import GPTNeoX
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    plan = load_plan("zero3")
    mesh = build_mesh(load_topology("emulated-4node", nodes=world // 2), plan, topo_index=rank)

    def build(seed: int):
        torch.manual_seed(seed)
        model = parallelize(GPTNeoX(cfg()), mesh=mesh)
        return model, ShardedOptimizer(model, optimizer[0], lr=1e-2, **(optimizer[1] or {}))

    def train(model, opt, step: int) -> None:
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randint(0, CFG_KW["vocab_size"], (2, 9), generator=g)
        logits = model(x[:, :-1])
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    model, opt = build(0)
    for s in range(2):
        train(model, opt, s)
    step_dir = save_checkpoint(
        out, model, opt, step=2, consumed_samples=4 * world, cfg=cfg(), plan_name=plan.name
    )
    other, other_opt = build(1)
    settles: list[int] = []
    settle = other_opt.load_state_dict

    def counted(sd: dict[str, Any]) -> None:  # every settle ends in the optimizer's load_state_dict
        settles.append(sd["step"])
        settle(sd)

    other_opt.load_state_dict = counted
    load_checkpoint(step_dir, other, other_opt, cfg=cfg())
    del other_opt.load_state_dict
    train(model, opt, 2)
    train(other, other_opt, 2)
    same = all(torch.equal(a, b) for a, b in zip(opt.master, other_opt.master)) and all(
        torch.equal(a, b) for name, bufs in opt.states.items() for a, b in zip(bufs, other_opt.states[name])
    )
    model.close()
    other.close()
    return {"settles": settles, "same": same, "steps": (opt.step_count, other_opt.step_count)}
