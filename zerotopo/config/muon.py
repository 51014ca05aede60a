"""Muon's row of the optimizer table: torch's ``Muon`` on the 2-D weight matrices of the transformer
layers, an elementwise optimizer of the table (the *aux*, AdamW by default) on everything else.

[Note: the Muon split] Muon (K. Jordan et al., "Muon: An optimizer for hidden layers in neural
networks", 2024; J. Liu et al., "Muon is Scalable for LLM Training", arXiv:2502.16982) orthogonalizes
each weight matrix's momentum with Newton-Schulz iterations; its published recipe runs it on the hidden
layers' 2-D weights only and an elementwise optimizer on the embedding, the output layer, norms and
biases. The ``optimizer`` block says both::

    optimizer:
      type: Muon
      params: {lr: 0.02, weight_decay: 0.01, momentum: 0.95, nesterov: true, ns_steps: 5,
               adjust_lr_fn: original,
               aux: {type: AdamW, lr: 6.0e-4, weight_decay: 0.0, betas: [0.9, 0.95], eps: 1.0e-8}}

``lr`` and ``weight_decay`` are Muon's (torch's ``Muon`` defaults for the others: momentum 0.95,
Nesterov, 5 steps, coefficients (3.4445, -4.775, 2.0315), ``adjust_lr_fn`` None = ``original``; ``eps``
takes NeoX's 1e-8 as for every type, torch's is 1e-7). ``aux`` is an elementwise type of the table and its
hyperparameters (``type`` AdamW by default; ``lr`` and ``weight_decay`` default to Muon's). The learning-rate
schedule scales both: the aux runs at ``aux.lr × (current lr / Muon's lr)``. Which parameter goes where is
the engine's rule (:mod:`zerotopo.engine.muon`), printed at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from zerotopo.config import checks as c
from zerotopo.config.optimizers import (
    SPECS,
    HyperparameterError,
    OptimizerSpec,
    check_hyperparameters,
    spec_for,
)

#: torch's ``Muon`` defaults of the hyperparameters the engine reads itself.
MUON_DEFAULTS: dict[str, Any] = {
    "momentum": 0.95,
    "nesterov": True,
    "ns_coefficients": (3.4445, -4.775, 2.0315),
    "eps": 1e-7,
    "ns_steps": 5,
    "adjust_lr_fn": None,
}
ADJUST_LR = ("original", "match_rms_adamw")


def _coefficients(value: Any) -> tuple[float, float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"expected three numbers (a, b, c), got {value!r}")
    return tuple(c.number()(v) for v in value)  # type: ignore[return-value]


def _adjust(value: Any) -> str | None:
    if value is None:
        return None
    if value not in ADJUST_LR:
        raise ValueError(f"expected one of {', '.join(ADJUST_LR)} (or none: original), got {value!r}")
    return str(value)


def aux_check(value: Any) -> dict[str, Any]:
    """The ``aux`` block: ``{type: <elementwise type>, <its hyperparameters>}``, normalized (the type as
    the table spells it); ValueError naming a type that is not elementwise or a key it does not take."""
    block = dict(c.mapping(value))
    kind = block.pop("type", "AdamW")
    try:
        spec = spec_for(kind)
    except ValueError as exc:
        raise ValueError(f"aux type {kind!r}: {exc}") from None
    if spec.name not in {s.name for s in SPECS.values()}:
        raise ValueError(f"aux type {kind!r}: the aux optimizer must be elementwise (AdamW, SGD, ...)")
    try:
        hyper = check_hyperparameters(spec, block)
    except HyperparameterError as exc:
        raise ValueError(f"aux.{exc.key}: {exc}") from None
    return {"type": spec.name, **hyper}


@dataclass(frozen=True)
class MuonSpec(OptimizerSpec):
    """Muon's row: what the config reader checks and what a checkpoint of Muon may hold (its momentum
    and any aux type's states). The engine runs with :func:`run_spec`, the row its aux type fills in."""

    def state_names(self, hyper: Mapping[str, Any]) -> tuple[str, ...]:
        """The aux type's states with ``hyper["aux"]``, then Muon's ``momentum_buffer`` (one buffer when
        the aux is SGD with momentum: the two cover different parameters)."""
        aux = dict(hyper.get("aux") or {"type": "AdamW"})
        spec = spec_for(aux.pop("type", "AdamW"))
        return (*(n for n in spec.state_names(aux) if n != "momentum_buffer"), "momentum_buffer")


MUON = MuonSpec(
    "Muon", "Muon",
    {"momentum": c.number(0.0, 1.0), "nesterov": c.boolean, "ns_coefficients": _coefficients,
     "eps": c.number(0.0, 1.0, lo_open=True), "ns_steps": c.integer(1, 99), "adjust_lr_fn": _adjust,
     "aux": aux_check},
    (("momentum_buffer", None), *sorted({(n, "aux") for s in SPECS.values() for n, _ in s.states})),
    defaults=dict(MUON_DEFAULTS), has_step=False,
)  # fmt: skip


def run_spec(aux: OptimizerSpec) -> OptimizerSpec:
    """The row a Muon run keeps with aux type ``aux``: named Muon (what its checkpoints record), Muon's
    hyperparameters, the aux type's states and Muon's ``momentum_buffer``; the rest (torch class, step
    count, scalars, initial values) is the aux type's, whose torch optimizer runs on the aux pieces."""
    states = (*((n, on) for n, on in aux.states if n != "momentum_buffer"), ("momentum_buffer", None))
    return replace(aux, name="Muon", params=MUON.params, states=states)


def split_hyperparameters(
    hyper: Mapping[str, Any], *, lr: float, weight_decay: float
) -> tuple[dict[str, Any], str, dict[str, Any], float, float]:
    """``(Muon's hyperparameters with torch's defaults, aux type, aux hyperparameters without lr and
    weight decay, aux lr, aux weight decay)`` from a checked Muon block and Muon's ``lr``/``weight_decay``."""
    muon = {**MUON_DEFAULTS, **{k: v for k, v in hyper.items() if k != "aux"}}
    aux = dict(hyper.get("aux") or {"type": "AdamW"})
    kind = aux.pop("type", "AdamW")
    aux_lr = float(aux.pop("lr", lr))
    aux_wd = aux.pop("weight_decay", None)
    return muon, kind, aux, aux_lr, float(weight_decay if aux_wd is None else aux_wd)
