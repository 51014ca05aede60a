"""The checkpoint components of a sharded model and its optimizer (see [Note: checkpoint components] in
:mod:`zerotopo.checkpoint.components`): what every run registers, under the names and keys of the checkpoint
layout described in :mod:`zerotopo.checkpoint.store`.

- ``model``: the fp32 master weights (``param/<name>``), the model config, every parameter's shape, and the
  world size and plan that wrote them; Hugging Face's ``config.json`` beside the shards.
- ``optimizer``: each per-element state (``<state>/<name>``), the step count, type and scalar states, and
  the learning-rate schedule's settings.
- ``loss_scaler``: the fp16 loss scaler (``scaler/<key>``).
- ``rng``: each rank's random generators (``rng/<rank>/torch``, ``rng/<rank>/cuda``).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.store import (
    _restore_scaler,
    _rng_tensors,
    _scaler_tensors,
    _shard_state,
    check_finite_state,
    settle_optimizer,
)


class OptimizerSettle:
    """The one settle of a load (:func:`~zerotopo.checkpoint.store.settle_optimizer`), shared by the model
    and optimizer components: each records what it loaded, and the first :meth:`run` after the load settles
    the optimizer on the loaded weights, with the step and scalar states the optimizer component loaded
    (its own current ones when only the weights were loaded); a second :meth:`run` does nothing."""

    def __init__(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self._pending = False
        self._state: tuple[int, dict[str, float] | None] | None = None

    def weights_loaded(self) -> None:
        """The master weights were written into the optimizer's buffers."""
        self._pending = True

    def state_loaded(self, step: int, scalars: dict[str, float] | None) -> None:
        """The optimizer's states were written into its buffers; it resumes at ``step`` with ``scalars``."""
        self._pending = True
        self._state = (step, scalars)

    def run(self) -> None:
        """Collective: settle the optimizer on what was loaded since the last settle, if anything."""
        if not self._pending:
            return
        opt = self.optimizer
        step, scalars = self._state or (opt.step_count, opt.scalar_state())
        self._pending, self._state = False, None
        settle_optimizer(self.model, opt, step=step, scalars=scalars)


class ModelState:
    """The sharded model's master weights and what describes them. After a load the optimizer settles on
    the loaded weights (with the loaded optimizer state when the optimizer component loaded too, else its
    current one), so a load of this component alone leaves a consistent model. ``settle``: the settle this
    component shares with the :class:`OptimizerState` of the same optimizer (default: its own)."""

    name = "model"

    def __init__(
        self,
        model,
        optimizer,
        cfg,
        *,
        plan_name: str = "",
        plan_label: str = "",
        eod: int | None = None,
        settle: OptimizerSettle | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.plan_name, self.plan_label, self.eod = plan_name, plan_label, eod
        self.settle = settle or OptimizerSettle(model, optimizer)

    def before_save(self, step: int, root: Path) -> None:
        self.optimizer.sync_shards()  # state held elsewhere (Muon's matrix owners) into the per-parameter chunks
        check_finite_state(self.optimizer, step=step, root=root)

    def state_dict(self) -> dict[str, Any]:
        return {
            "world_size": dist.get_world_size(),
            "plan": self.plan_name,
            "degrees": self.plan_label,
            "model": asdict(self.cfg),
            "parameters": {s.name: list(s.shape) for u in self.model.units for s in u.slots},
            **_shard_state(self.model, self.optimizer, weights_only=True),
        }

    def files(self) -> dict[str, str | Path]:
        from zerotopo.models.hf import hf_config_dict

        hf = hf_config_dict(self.cfg)
        if self.eod is not None:
            hf["bos_token_id"] = hf["eos_token_id"] = int(self.eod)
        return {"config.json": json.dumps(hf, indent=2) + "\n"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.settle.weights_loaded()  # the weights were read into the optimizer's master buffers in place

    def after_load(self) -> None:
        self.settle.run()


class OptimizerState:
    """The optimizer's per-element states, step count, type and scalars, and the settings of the learning
    rate schedule (``lr_schedule``: recorded for the resume's check; the schedule follows the step). After
    a load the optimizer settles on them once (``settle``: shared with the :class:`ModelState` of the same
    optimizer; default: its own)."""

    name = "optimizer"

    def __init__(
        self,
        model,
        optimizer,
        *,
        lr_schedule: dict[str, Any] | None = None,
        settle: OptimizerSettle | None = None,
    ) -> None:
        self.model, self.optimizer, self.lr_schedule = model, optimizer, lr_schedule
        self.settle = settle or OptimizerSettle(model, optimizer)

    def state_dict(self) -> dict[str, Any]:
        opt = self.optimizer
        out: dict[str, Any] = {
            "optimizer_steps": opt.step_count,
            "optimizer": {"type": opt.spec.name, "states": list(opt.states), "scalars": opt.scalar_state()},
            "lr_schedule": self.lr_schedule,
        }
        out.update(_shard_state(self.model, opt, states_only=True))
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("optimizer") or {}
        self.settle.state_loaded(int(state["optimizer_steps"]), saved.get("scalars"))

    def after_load(self) -> None:
        self.settle.run()


class LossScalerState:
    """The fp16 loss scaler's state (``loss_scaler``: its keys, or None when the run has no scaler)."""

    name = "loss_scaler"

    def __init__(self, model) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        scaler = self.model.scaler
        if scaler is None:
            return {"loss_scaler": None}
        return {"loss_scaler": sorted(scaler.state_dict()), **_scaler_tensors(scaler)}

    def load_targets(self, ckpt) -> dict[str, Any]:
        stored = ckpt.metadata.state_dict_metadata
        if self.model.scaler is None:
            return {}
        keys = [k for k in stored if k.startswith("scaler/")]
        return {k: torch.zeros(tuple(stored[k].size), dtype=torch.float64) for k in keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        loaded = {k: v for k, v in state.items() if k.startswith("scaler/")}
        if self.model.scaler is not None and loaded:
            _restore_scaler(self.model.scaler, loaded)


class RngState:
    """Each rank's random generators. A checkpoint of another world size has no state for this rank's
    place: every rank then reseeds from ``seed`` plus the step, with a notice on rank 0."""

    name = "rng"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._from: tuple[Path, int, int] | None = None

    def state_dict(self) -> dict[str, Any]:
        return _rng_tensors(dist.get_rank())

    def load_targets(self, ckpt) -> dict[str, Any]:
        rank, world = dist.get_rank(), dist.get_world_size()
        stored = ckpt.metadata.state_dict_metadata
        self._from = (ckpt.path, ckpt.step, int(ckpt.manifest["world_size"]))
        if ckpt.manifest["world_size"] != world or f"rng/{rank}/torch" not in stored:
            return {}
        out = {f"rng/{rank}/torch": torch.empty(tuple(stored[f"rng/{rank}/torch"].size), dtype=torch.uint8)}
        if f"rng/{rank}/cuda" in stored and torch.cuda.is_available():
            out[f"rng/{rank}/cuda"] = torch.empty(tuple(stored[f"rng/{rank}/cuda"].size), dtype=torch.uint8)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank = dist.get_rank()
        if f"rng/{rank}/torch" in state:
            torch.set_rng_state(state[f"rng/{rank}/torch"])
            if f"rng/{rank}/cuda" in state:
                torch.cuda.set_rng_state(state[f"rng/{rank}/cuda"])
            return
        path, step, saved_world = self._from or (Path("."), 0, 0)
        torch.manual_seed(self.seed + step)
        if rank == 0:
            warnings.warn(
                f"{path} was written by {saved_world} ranks, this run has {dist.get_world_size()}: "
                "the weights and optimizer states are resharded; random states restart from the seed",
                stacklevel=3,
            )


def model_components(
    model,
    optimizer,
    cfg,
    *,
    plan_name: str = "",
    plan_label: str = "",
    seed: int = 0,
    lr_schedule: dict[str, Any] | None = None,
    eod: int | None = None,
) -> list[Any]:
    """The components every run registers, in the order they load: model, optimizer, loss scaler, RNG.
    The model and optimizer share one :class:`OptimizerSettle`: a load settles the optimizer once."""
    settle = OptimizerSettle(model, optimizer)
    return [
        ModelState(model, optimizer, cfg, plan_name=plan_name, plan_label=plan_label, eod=eod, settle=settle),
        OptimizerState(model, optimizer, lr_schedule=lr_schedule, settle=settle),
        LossScalerState(model),
        RngState(seed),
    ]
