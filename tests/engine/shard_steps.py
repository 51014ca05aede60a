"""Steps of a sharded optimizer on one unit beside torch's own optimizer on the unit's parameters."""

from __future__ import annotations

from typing import Any

import torch

from zerotopo.engine.units import FlatUnit


def grads(u: FlatUnit, step: int) -> torch.Tensor:
    """A gradient of the unit's chunk, zero where no trainable parameter is (the engine's flat_grad)."""
    g = torch.randn(u.padded, generator=torch.Generator().manual_seed(step))
    return g * u.masks()[1]


def step_both(opt: Any, u: FlatUnit, ref: torch.optim.Optimizer, ref_params: list, steps: range) -> None:
    """Apply the same gradients to the sharded optimizer's unit 0 and to ``ref`` over ``ref_params``."""
    for step in steps:
        grad = grads(u, step)
        opt._host_steps += 1
        opt._apply(0, grad.clone())
        for s, r in zip(u.slots, ref_params):
            r.grad = grad[s.offset : s.offset + s.numel].view(s.shape).clone()
        ref.step()


def one_unit(frozen: bool) -> tuple[FlatUnit, torch.nn.Module]:
    """One unit (world 1) of a Linear (decayed) and a LayerNorm (not decayed, its weight frozen with
    ``frozen``), seeded."""
    from zerotopo.placement.plan import Degrees

    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    if frozen:
        mod[1].weight.requires_grad_(False)
    u = FlatUnit(
        "u", mod, list(mod.named_parameters()), index=0, degrees=Degrees(params=1, grads=1, optim=1, world=1),
        topo_index=0, param_dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    return u, mod
