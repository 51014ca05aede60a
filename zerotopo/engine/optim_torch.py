"""torch's optimizer on views of the flat fp32 master shards (see [Note: torch's optimizer on the
shards] in ``optim.py``): resolving the type and its hyperparameters from the table in
:mod:`zerotopo.config.optimizers`, building one torch optimizer per unit over the runs of its chunk, and
keeping torch's per-piece state pointed at the flat per-unit state buffers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from zerotopo.config.optimizers import (
    NEOX_DEFAULTS,
    SPECS,
    HyperparameterError,
    OptimizerSpec,
    check_hyperparameters,
    spec_for,
)
from zerotopo.engine.units import FlatUnit
from zerotopo.errors import ZerotopoError


def _fused_supported(device: torch.device, spec: OptimizerSpec = SPECS["adamw"]) -> bool:
    """Whether torch has a fused kernel (taking ``found_inf``) of ``spec``'s optimizer on ``device``
    (AdamW and SGD: CUDA, the CPU and torch's other fused devices; Adagrad: the CPU and CUDA; the
    others none); elsewhere the foreach one runs."""
    devices = _get_fused_kernels_supported_devices() if spec.fused is None else spec.fused
    return device.type in devices


def resolve_optimizer(
    name: str,
    hyperparameters: Mapping[str, Any] | None,
    *,
    betas: tuple[float, float] | None = None,
    eps: float | None = None,
) -> tuple[OptimizerSpec, dict[str, Any]]:
    """The table's row for ``name`` and its checked hyperparameters (``lr`` and ``weight_decay`` are
    the optimizer's own arguments), ``betas``/``eps`` at NeoX's defaults where the type takes them and
    none was given. A :class:`ZerotopoError` names an unknown type or a hyperparameter it does not take."""
    try:
        spec = spec_for(name)
    except ValueError as exc:
        raise ZerotopoError(f"optimizer {name!r}: {exc}") from None
    given = dict(hyperparameters or {})
    for key, value in (("betas", betas), ("eps", eps)):
        if value is not None:
            given[key] = value
    try:
        hyper = check_hyperparameters(spec, given)
    except HyperparameterError as exc:
        raise ZerotopoError(f"optimizer {spec.name}: {exc.key}: {exc}") from None
    for key in ("lr", "weight_decay"):
        if key in hyper:
            raise ZerotopoError(
                f"optimizer {spec.name}: pass {key} as its own argument, not a hyperparameter"
            )
    for key, value in NEOX_DEFAULTS.items():
        if key in spec.params:
            hyper.setdefault(key, value)
    return spec, hyper


class TorchOnShards:
    """The torch-optimizer half of :class:`~zerotopo.engine.optim.ShardedOptimizer`: it reads
    ``param_groups``, ``master``, ``states``, ``pieces``, ``optims``, ``fused`` and ``_host_steps``."""

    spec: OptimizerSpec = SPECS["adamw"]
    """The optimizer's row of the table (AdamW unless another is asked for)."""
    param_groups: list[dict[str, Any]]
    master: list[torch.Tensor]
    states: dict[str, list[torch.Tensor]]
    pieces: list[list[tuple[torch.Tensor, int]]]
    optims: list[torch.optim.Optimizer | None]
    fused: bool
    _host_steps: int

    @property
    def bytes_per_element(self) -> int:
        """Bytes of optimizer state per element of the shard: fp32 master and per-element states
        (AdamW: 12, SGD with momentum: 8, RMSprop centered with momentum: 16)."""
        return 4 * (1 + len(self.states))

    @property
    def exp_avg(self) -> list[torch.Tensor]:
        """Adam's flat first moments per unit (``states["exp_avg"]``)."""
        return self.states["exp_avg"]

    @property
    def exp_avg_sq(self) -> list[torch.Tensor]:
        """Adam's flat second moments per unit (``states["exp_avg_sq"]``)."""
        return self.states["exp_avg_sq"]

    def _elementwise(self, slot: Any) -> bool:
        """Whether the torch optimizer runs on ``slot``'s elements (every one; Muon keeps its matrices)."""
        return True

    def _hyper(self) -> dict[str, Any]:
        """The hyperparameters torch's optimizer takes from ``param_groups[0]`` (weight decay per group)."""
        return {k: v for k, v in self.param_groups[0].items() if k not in ("params", "weight_decay")}

    def _torch_optimizer(self, i: int, u: FlatUnit) -> torch.optim.Optimizer | None:
        """torch's optimizer over the trainable runs of unit ``i``'s master chunk (views, so the update
        lands in ``master[i]``), with views of the flat states as its state; one group with weight decay
        and one without. None when the chunk has nothing trainable."""
        groups = []
        for decay in (True, False):
            runs = u.runs(lambda s, d=decay: s.trainable and s.decay is d and self._elementwise(s))
            views = [self.master[i][a:b] for a, b in runs]
            self.pieces[i] += [(v, a) for v, (a, _) in zip(views, runs)]
            if views:
                groups.append({"params": views, "decay": decay})
        if not groups:
            return None
        kind = {"fused": True} if self.fused else {"foreach": True}
        cls = getattr(torch.optim, self.spec.torch_class)
        opt = cls(groups, **self._hyper(), weight_decay=0.0, **kind)
        for v, _ in self.pieces[i]:
            opt.state[v] = {}
        self._bind_states(i, opt)
        return opt

    def _bind_states(self, i: int, opt: torch.optim.Optimizer) -> None:
        """Point torch's state of each piece of unit ``i`` at the flat buffers (and fresh scalars). A
        state torch takes from the first gradient (:meth:`OptimizerSpec.first_from_grad`) is left out
        before the first step, so torch creates it; :meth:`_adopt_created` moves it into the buffer."""
        fresh = self._host_steps == 0
        lazy = self.spec.first_from_grad(self._hyper())
        for v, a in self.pieces[i]:
            st = opt.state[v]
            st.clear()
            if self.spec.has_step:
                st["step"] = self._step_tensor(v.device)
            for name, value in self.spec.scalars:
                st[name] = self._scalar_tensor(value, v.device)
            for name, bufs in self.states.items():
                if not (fresh and name in lazy):
                    st[name] = bufs[i][a : a + v.numel()]

    def _adopt_created(self, i: int, hyper: dict[str, Any]) -> None:
        """Copy a state torch created in its first step into the flat buffer and hand torch the view
        (``hyper``: :meth:`_hyper`, read once per unit by the caller)."""
        opt = self.optims[i]
        for name in self.spec.first_from_grad(hyper):
            for v, a in self.pieces[i]:
                st = opt.state[v]
                created = st.get(name)
                view = self.states[name][i][a : a + v.numel()]
                if created is not None and created.data_ptr() != view.data_ptr():
                    view.copy_(created)
                    st[name] = view

    def _step_tensor(self, device: torch.device) -> torch.Tensor:
        """torch's per-parameter step count as its optimizers keep it (on the device when fused)."""
        return self._scalar_tensor(float(self._host_steps), device)

    def _scalar_tensor(self, value: float, device: torch.device) -> torch.Tensor:
        if self.fused:
            return torch.full((), value, dtype=torch.float32, device=device)
        return torch.tensor(value)

    def _set_torch_steps(self, value: int) -> None:
        for opt in self.optims:
            if opt is not None:
                for st in opt.state.values():
                    if "step" in st:
                        st["step"].fill_(float(value))

    def scalar_state(self) -> dict[str, float]:
        """The scalar states besides ``step`` (NAdam's ``mu_product``): every piece holds the same value."""
        out = {}
        for name, initial in self.spec.scalars:
            held = [st[name] for opt in self.optims if opt is not None for st in opt.state.values()]
            out[name] = float(held[0]) if held else initial
        return out

    def _set_scalars(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            for opt in self.optims:
                if opt is not None:
                    for st in opt.state.values():
                        st[name].fill_(float(value))
