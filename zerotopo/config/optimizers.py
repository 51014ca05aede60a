"""The optimizers the sharded step can run: torch's elementwise optimizers, one row each.

[Note: elementwise optimizers] The sharded step runs a torch optimizer on views of each unit's flat fp32
master chunk (``zerotopo/engine/optim.py``). That is exact only for an optimizer whose update of an
element reads that element alone: per-element state of the parameter's shape, plus scalar state every
element shares (``step``, NAdam's ``mu_product``). Each per-element state is one flat buffer per unit laid
out as the master chunk, handed to torch as views, so sharding, checkpoints (``<state>/<parameter>``) and
resharding treat every row alike. LBFGS (whole-model history vectors and a closure), SparseAdam (sparse
gradients), Adafactor (factored row and column statistics) and ASGD / Rprop (not in this table) are refused.

The table is plain data (torch is imported by the engine, not here), so the config reader checks a
config without importing torch. ``tests/config/test_optimizers.py`` checks every row against torch's own
classes: the state names, the defaults listed here and the hyperparameters each class takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zerotopo.config import checks as c

#: Hyperparameters every type takes; the others are in each row's ``params``.
COMMON = {"lr": c.number(0.0, 10.0, lo_open=True), "weight_decay": c.optional(c.number(0.0, 10.0))}
_BETAS = {"betas": c.betas, "eps": c.number(0.0, 1.0, lo_open=True)}
#: NeoX's defaults for ``betas`` and ``eps``, used by every type that takes them when they are not given.
NEOX_DEFAULTS = {"betas": (0.9, 0.95), "eps": 1e-8}
#: Per-element states that are never negative by construction (a negative value means a damaged
#: checkpoint), with what they are.
NON_NEGATIVE = {
    "exp_avg_sq": "Adam's second moment",
    "max_exp_avg_sq": "AMSGrad's largest second moment",
    "sum": "Adagrad's sum of squared gradients",
    "square_avg": "a mean of squared gradients",
    "exp_inf": "Adamax's infinity norm",
    "acc_delta": "Adadelta's mean of squared updates",
}


def _sgd_check(hyper: Mapping[str, Any]) -> tuple[str, str] | None:
    if hyper.get("nesterov") and (hyper.get("momentum", 0.0) <= 0 or hyper.get("dampening", 0.0) != 0):
        return "nesterov", "nesterov needs momentum > 0 and dampening 0 (torch's SGD rule)"
    return None


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer: its torch class and what the sharded step and the checkpoints need to know of it."""

    name: str
    """The canonical spelling (what checkpoints record)."""
    torch_class: str
    """The class in ``torch.optim``."""
    params: Mapping[str, c.Check]
    """Hyperparameters it takes beyond ``lr`` and ``weight_decay``, with their value checks."""
    states: tuple[tuple[str, str | None], ...]
    """Per-element states: ``(name, hyperparameter that switches it on, or None: always kept)``."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """torch's defaults of the hyperparameters that switch states on or set initial values."""
    scalars: tuple[tuple[str, float], ...] = ()
    """Scalar states besides ``step`` every element shares, with their initial value."""
    has_step: bool = True
    """Whether torch keeps a ``step`` count per parameter (SGD does not)."""
    fused: tuple[str, ...] | None = ()
    """Device types with a fused kernel (taking ``found_inf``); None: every one torch's fused kernels run on."""
    initial: Mapping[str, str] = field(default_factory=dict)
    """States whose initial value is a hyperparameter (Adagrad's ``sum``); the others start at zero."""
    check: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    """A rule between hyperparameters: returns ``(key, what is wrong)``, or None."""

    def takes(self) -> tuple[str, ...]:
        """Every hyperparameter name it takes, ``lr`` and ``weight_decay`` first."""
        return (*COMMON, *self.params)

    def state_names(self, hyper: Mapping[str, Any]) -> tuple[str, ...]:
        """The per-element states kept with hyperparameters ``hyper`` (torch's defaults for the rest)."""
        full = {**self.defaults, **hyper}
        return tuple(n for n, on in self.states if on is None or full.get(on))

    def initial_value(self, state: str, hyper: Mapping[str, Any]) -> float:
        """The value ``state`` starts at (and frozen parameters keep)."""
        key = self.initial.get(state)
        return float({**self.defaults, **hyper}[key]) if key else 0.0

    def first_from_grad(self, hyper: Mapping[str, Any]) -> tuple[str, ...]:
        """States torch sets to the first gradient itself rather than updating a zero buffer: SGD's
        momentum buffer, where the two differ only with ``dampening`` (``buf = (1 - dampening)·grad``)."""
        full = {**self.defaults, **hyper}
        if self.torch_class == "SGD" and full.get("momentum") and full.get("dampening"):
            return ("momentum_buffer",)
        return ()


_ADAMW = OptimizerSpec(
    "AdamW", "AdamW", {**_BETAS, "amsgrad": c.boolean},
    (("exp_avg", None), ("exp_avg_sq", None), ("max_exp_avg_sq", "amsgrad")),
    defaults={"amsgrad": False}, fused=None,
)  # fmt: skip
SPECS: dict[str, OptimizerSpec] = {
    s.name.lower(): s
    for s in (
        _ADAMW,
        OptimizerSpec(
            "SGD", "SGD",
            {"momentum": c.number(0.0, 1.0), "dampening": c.number(0.0, 1.0), "nesterov": c.boolean},
            (("momentum_buffer", "momentum"),),
            defaults={"momentum": 0.0, "dampening": 0.0, "nesterov": False}, has_step=False, fused=None,
            check=_sgd_check,
        ),
        OptimizerSpec(
            "Adagrad", "Adagrad",
            {"eps": _BETAS["eps"], "lr_decay": c.number(0.0), "initial_accumulator_value": c.number(0.0)},
            (("sum", None),), defaults={"initial_accumulator_value": 0.0}, fused=("cpu", "cuda"),
            initial={"sum": "initial_accumulator_value"},
        ),
        OptimizerSpec(
            "Adadelta", "Adadelta", {"eps": _BETAS["eps"], "rho": c.number(0.0, 1.0)},
            (("square_avg", None), ("acc_delta", None)),
        ),
        OptimizerSpec(
            "RMSprop", "RMSprop",
            {"eps": _BETAS["eps"], "alpha": c.number(0.0, 1.0), "momentum": c.number(0.0, 1.0),
             "centered": c.boolean},
            (("square_avg", None), ("momentum_buffer", "momentum"), ("grad_avg", "centered")),
            defaults={"momentum": 0.0, "centered": False},
        ),
        OptimizerSpec("Adamax", "Adamax", dict(_BETAS), (("exp_avg", None), ("exp_inf", None))),
        OptimizerSpec(
            "NAdam", "NAdam",
            {**_BETAS, "momentum_decay": c.number(0.0), "decoupled_weight_decay": c.boolean},
            (("exp_avg", None), ("exp_avg_sq", None)), scalars=(("mu_product", 1.0),),
        ),
        OptimizerSpec(
            "RAdam", "RAdam", {**_BETAS, "decoupled_weight_decay": c.boolean},
            (("exp_avg", None), ("exp_avg_sq", None)),
        ),
    )
}  # fmt: skip
#: Other spellings: NeoX's ``Adam`` is DeepSpeed's FusedAdam, decoupled weight decay by default: AdamW.
ALIASES = {"adam": "adamw"}
#: torch optimizers that are not elementwise, with the reason they cannot run on flat shards.
REFUSED = {
    "lbfgs": "LBFGS keeps whole-model history vectors and needs a closure",
    "sparseadam": "SparseAdam takes sparse gradients; the engine reduces dense ones",
    "adafactor": "Adafactor keeps factored row and column statistics of each matrix",
    "asgd": "ASGD keeps per-parameter tensors (eta, mu) that are not per element",
    "rprop": "Rprop is meant for full-batch training and is not supported",
}


def supported() -> str:
    """The accepted names, as an error message lists them."""
    return "Adam, " + ", ".join(s.name for s in SPECS.values()) + ", Muon"


def spec_for(name: str) -> OptimizerSpec:
    """The row for ``name`` (any case); ValueError naming the supported ones otherwise."""
    key = str(name).lower()
    key = ALIASES.get(key, key)
    if key in SPECS:
        return SPECS[key]
    if key == "muon":
        from zerotopo.config.muon import MUON

        return MUON
    why = f"{REFUSED[key]}, so it cannot run on flat shards; " if key in REFUSED else ""
    raise ValueError(f"{why}expected one of {supported()} (torch's elementwise optimizers)")


def canonical(name: str) -> str:
    """``name`` as the table spells it (``adamw`` -> ``AdamW``); ``Adam`` stays ``Adam``."""
    if str(name).lower() in ALIASES:
        return "Adam"
    return spec_for(name).name


def check_hyperparameters(spec: OptimizerSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` checked against what ``spec`` takes, each value normalized by its check; a
    :class:`HyperparameterError` naming the key for one the type does not take, a bad value or a broken
    rule between them."""
    checks = {**COMMON, **spec.params}
    out = {}
    for key, raw in given.items():
        if key not in checks:
            raise HyperparameterError(
                key, f"{spec.name} takes no {key!r}; it takes {', '.join(spec.takes())}"
            )
        try:
            out[key] = checks[key](raw)
        except ValueError as exc:
            raise HyperparameterError(key, str(exc)) from None
    broken = spec.check(out) if spec.check else None
    if broken:
        raise HyperparameterError(*broken)
    return out


class HyperparameterError(ValueError):
    """A hyperparameter the optimizer type does not take, or a bad value: ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def state_names() -> frozenset[str]:
    """Every per-element state name of the table (the checkpoint keys ``<state>/<parameter>``)."""
    return frozenset(n for spec in SPECS.values() for n, _ in spec.states)


def is_muon(name: str) -> bool:
    """Whether ``name`` is Muon (any case): the matrix optimizer of :mod:`zerotopo.config.muon`."""
    return str(name).lower() == "muon"
