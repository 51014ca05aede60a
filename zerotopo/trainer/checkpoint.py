"""Checkpoints: the model as a Hugging Face GPT-NeoX safetensors file, optimizer states per rank.

Layout of ``<save>/step_<N>/``: ``model.safetensors`` + ``config.json`` (opens with
``GPTNeoXForCausalLM.from_pretrained``), ``optim_rank<r>.pt`` (this rank's fp32 master, Adam moments and
gradient-free state, only valid for the same plan and world size), ``trainer_state.json`` (step, world
size, plan). ``<save>/latest`` names the newest step directory. A run resumes with ``load: <save>``:
the model always loads (any plan, any world size); optimizer shards load when the plan and world size
match, otherwise the optimizer restarts from the loaded weights with a warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import hf_config_dict, load_safetensors, save_safetensors
from zerotopo.models.neox import GPTNeoX, NeoXConfig


def save_checkpoint(
    root: Path, model, optimizer, *, step: int, rank: int, cfg: NeoXConfig, plan_label: str = ""
) -> Path:
    """Collective: every rank calls it. Returns the step directory."""
    out = Path(root) / f"step_{step}"
    full = model.full_state_dict()  # collective gather of the fp32 master parameters
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        plain = GPTNeoX(cfg)
        plain.load_state_dict({k: v.float() for k, v in full.items()}, strict=True)
        save_safetensors(plain, out / "model.safetensors")
        (out / "config.json").write_text(json.dumps(hf_config_dict(cfg), indent=2) + "\n")
    dist.barrier()
    torch.save(optimizer.state_dict(), out / f"optim_rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        state = {"step": step, "world_size": dist.get_world_size(), "plan": plan_label}
        (out / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        (Path(root) / "latest").write_text(out.name + "\n")
    dist.barrier()
    return out


def load_tensor_file(path: Path) -> dict:
    """Read a ``torch.save`` file without unpickling code: only tensors, numbers, strings and
    containers load (``weights_only=True``); anything else is refused with the file named."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every refusal becomes one readable error
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ZerotopoError(
            f"{path}: not a zerotopo checkpoint shard (refused to load it: {first}); checkpoint files "
            "hold tensors and plain values only, and zerotopo never runs code from a file"
        ) from None


def resolve_checkpoint(path: Path) -> Path:
    """A step directory from ``path``: the directory itself, or the one ``path/latest`` names."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    latest = path / "latest"
    if latest.exists():
        return path / latest.read_text().strip()
    raise ZerotopoError(f"no checkpoint at {path}: expected {path}/model.safetensors or {path}/latest")


def load_checkpoint(path: Path, model, optimizer, *, rank: int, cfg: NeoXConfig, plan_label: str = "") -> int:
    """Load weights (and optimizer shards when compatible) into a wrapped model; returns the step."""
    step_dir = resolve_checkpoint(path)
    state = json.loads((step_dir / "trainer_state.json").read_text())
    plain = GPTNeoX(cfg)
    load_safetensors(plain, step_dir / "model.safetensors")
    model.load_full_state_dict(plain.state_dict())
    shard = step_dir / f"optim_rank{rank}.pt"
    same_layout = state.get("world_size") == dist.get_world_size() and state.get("plan") == plan_label
    if same_layout and shard.exists():
        optimizer.load_state_dict(load_tensor_file(shard))
    elif rank == 0:
        warnings.warn(
            f"{step_dir}: optimizer states were saved for plan {state.get('plan')!r} on "
            f"{state.get('world_size')} ranks; this run uses {plan_label!r} on {dist.get_world_size()}: "
            "restarting the optimizer from the loaded weights",
            stacklevel=2,
        )
    return int(state["step"])
