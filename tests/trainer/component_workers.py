"""Rank functions for the checkpoint-component tests: a tiny NeoX model trained with one more checkpointed
component registered beside the standard set (a running record of the job's mean losses)."""

from __future__ import annotations

from typing import Any

from tests.trainer.ckpt_workers import CFG_KW, cfg


class LossHistory:
    """State a user adds to a run: the job's mean loss of every step so far (a tensor in the shards) and
    how many steps it holds (a JSON value in the manifest). A checkpoint without it starts it empty."""

    name = "losses"

    def __init__(self, capacity: int) -> None:
        import torch

        self.history = torch.zeros(capacity, dtype=torch.float64)
        self.count = 0
        self.loaded_from_checkpoint = False

    def record(self, loss: float) -> None:
        self.history[self.count] = loss
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"losses/history": self.history, "loss_count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "losses/history" not in state:
            return  # written before this component was registered: start empty
        self.history.copy_(state["losses/history"])
        self.count = int(state["loss_count"])
        self.loaded_from_checkpoint = True


def component_worker(rank: int, world: int, out: str, steps: int, load_from: str | None = None) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from zerotopo.checkpoint.store import standard_checkpointer
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, parallelize
    from zerotopo.models.neox import GPTNeoX
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    plan = load_plan("zero3")
    mesh = build_mesh(load_topology("emulated-4node", nodes=world // 2), plan, topo_index=rank)
    torch.manual_seed(0)
    model = parallelize(GPTNeoX(cfg()), mesh=mesh)
    opt = ShardedOptimizer(model, lr=1e-2)
    checkpointer = standard_checkpointer(model, opt, cfg=cfg(), plan_name=plan.name)
    losses = checkpointer.register(LossHistory(capacity=8))  # the one line that adds checkpointed state
    step = 0
    if load_from:
        step = checkpointer.load(load_from).step
    loaded = {"count": losses.count, "history": losses.history[: losses.count].tolist()}
    for s in range(step, steps):
        g = torch.Generator().manual_seed(100 * s + rank)
        x = torch.randint(0, CFG_KW["vocab_size"], (2, 9), generator=g)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        model.scale_loss(loss).backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().to(torch.float64).reshape(1)
        dist.all_reduce(mean)
        losses.record(float(mean) / world)
    checkpointer.save(out, step=steps)
    model.close()
    return {"loaded": loaded, "loaded_from_checkpoint": losses.loaded_from_checkpoint,
            "history": losses.history[: losses.count].tolist()}  # fmt: skip
