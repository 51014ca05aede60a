"""The one validator of a :class:`~zerotopo.config.tree.TrainConfig`.

:func:`validate` runs, in this order, each field's check (which also normalizes the value: ``"6e-4"`` to
0.0006, ``"969,30,1"`` to fractions), and each section's ``check()`` (the rules between its fields; every rule
between keys today reads one section), and returns the config with the normalized values. The NeoX reader
(:func:`zerotopo.config.neox.load_neox_config`) calls it, and so does anyone who builds a config in code;
nothing else validates a config. An invalid value is a :class:`~zerotopo.errors.ConfigError` naming the
file and the key as written (or, for a config built in code, the field's path), the value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zerotopo.config.optimizers import (
    HyperparameterError,
    canonical,
    check_hyperparameters,
    spec_for,
    supported,
)
from zerotopo.config.tree import SECTIONS, OptimizerConfig, Section, TrainConfig
from zerotopo.errors import ConfigError, short


def validate(config: TrainConfig) -> TrainConfig:
    """``config`` with every value checked and normalized; a :class:`ConfigError` for the first that is
    not valid (see the module docstring for the order)."""
    sections = {name: _checked_section(getattr(config, name)) for name in SECTIONS}
    config = dataclasses.replace(config, **sections, **_checked_fields(config, config))
    for name in SECTIONS:
        getattr(config, name).check()
    return config


def _checked_section(section: Section) -> Section:
    """``section`` with its fields' values checked (nested blocks too) and normalized."""
    changes = _checked_fields(section, section)
    for f in dataclasses.fields(section):
        if f.metadata.get("block"):
            value = getattr(section, f.name)
            where = section.where(f.name)
            changes[f.name] = (
                _checked_optimizer(value, where)
                if isinstance(value, OptimizerConfig)
                else dataclasses.replace(
                    value, **_checked_fields(value, section, where["key"], where["source"])
                )
            )
    return dataclasses.replace(section, **changes) if changes else section


def _checked_fields(
    obj: Any, section: Section, prefix: str | None = None, source: str | None = None
) -> dict[str, Any]:
    """``{field: normalized value}`` of ``obj``'s checked fields whose value is not the default (a default
    is valid by construction; a test holds every default to its check). Fields of a nested block are named
    ``<prefix>.<field>`` and their file is the block's."""
    out = {}
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        if check is None or (f.default is not dataclasses.MISSING and _same(value, f.default)):
            continue
        where = section.where(f.name) if prefix is None else {"source": source, "key": f"{prefix}.{f.name}"}
        try:
            out[f.name] = check(value)
        except ValueError as exc:
            raise ConfigError(f"{short(value)}: {exc}", **where) from None
    return out


def _same(value: Any, default: Any) -> bool:
    """``value`` is the default itself (equal and of the same type: ``"1"`` is not ``1``, nor ``True``)."""
    return type(value) is type(default) and value == default


def _checked_optimizer(opt: OptimizerConfig, where: dict[str, str | None]) -> OptimizerConfig:
    """The optimizer's type from the table, and every hyperparameter given (a field that is not its
    default, or one of ``options``) checked against what the type takes and normalized; the normalized
    ``lr``, ``betas``, ``eps`` and ``weight_decay`` land in their fields, the others in ``options``."""
    key, source = where["key"], where["source"]
    try:
        if not isinstance(opt.type, str):
            raise ValueError(f"expected one of {supported()}")
        kind = canonical(opt.type)
    except ValueError as exc:
        raise ConfigError(f"{short(opt.type)}: {exc}", source=source, key=f"{key}.type") from None
    fields = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
    named = {k: getattr(opt, k) for k in ("lr", "betas", "eps", "weight_decay")}
    given = {k: v for k, v in named.items() if not _same(v, fields[k])}
    given.update(opt.options)
    params = f"{key}.params" if key == "optimizer" else key
    try:
        checked = check_hyperparameters(spec_for(kind), given)
    except HyperparameterError as exc:
        shown = f"{short(given[exc.key])}: " if exc.key in given else ""
        raise ConfigError(f"{shown}{exc}", source=source, key=f"{params}.{exc.key}") from None
    options = {k: v for k, v in checked.items() if k not in named}
    return OptimizerConfig(type=kind, options=options, **{k: v for k, v in checked.items() if k in named})
