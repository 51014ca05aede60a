"""Value checks for config keys: each takes the raw YAML value and returns the normalized one or raises
``ValueError`` with a message saying what is allowed (the caller adds the file, key and value)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from zerotopo.placement import numbers

Check = Callable[[Any], Any]

#: No integer key is ever larger (2**53: still exact as a float).
MAX_INT = 2**53


def _number(value: Any, kind: type) -> Any:
    # PyYAML reads "6e-4" (no dot) as a string, as YAML 1.1 says; NeoX configs write it that way.
    expected = "expected an integer" if kind is int else "expected a number"
    return numbers.number(
        value,
        integer=kind is int,
        strings=True,
        minimum=-MAX_INT if kind is int else None,
        maximum=MAX_INT if kind is int else None,
        messages={
            "bool": f"{expected}, not a boolean",
            "type": expected,
            "whole": expected,
            "finite": "expected a finite number",
            "low": f"expected an integer of at most {MAX_INT}",
            "high": f"expected an integer of at most {MAX_INT}",
        },
    )


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    def check(value: Any) -> int:
        v = _number(value, int)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"expected an integer in [{lo if lo is not None else '-inf'}, {hi or 'inf'}]")
        return v

    return check


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Check:
    def check(value: Any) -> float:
        v = _number(value, float)
        low_bad = lo is not None and (v <= lo if lo_open else v < lo)
        if low_bad or (hi is not None and v > hi):
            left = "(" if lo_open else "["
            raise ValueError(f"expected a number in {left}{lo if lo is not None else '-inf'}, {hi or 'inf'}]")
        return v

    return check


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected true or false")


def choice(*options: str, aliases: dict[str, str] | None = None) -> Check:
    """One of ``options``, matched without regard to case; ``aliases`` map other spellings."""
    table = {o.lower(): o for o in options}
    table.update({k.lower(): v for k, v in (aliases or {}).items()})

    def check(value: Any) -> str:
        if isinstance(value, str) and value.lower() in table:
            return table[value.lower()]
        raise ValueError(f"expected one of {', '.join(options)}")

    return check


def const(expected: Any, why: str) -> Check:
    """Keys NeoX has that zerotopo supports with one value only (dropout 0, rotary positions, ...)."""

    def check(value: Any) -> Any:
        if value != expected and not (isinstance(expected, str) and str(value).lower() == expected):
            raise ValueError(f"expected {expected!r}: {why}")
        return expected

    return check


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, not a {type(value).__name__}")
    if not value.strip() or "\x00" in value:
        raise ValueError("expected a non-empty string without NUL characters")
    return value


def optional(inner: Check) -> Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def str_or_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) and value.strip():
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise ValueError("expected a path or a list of paths")


def split(value: Any) -> tuple[float, float, float]:
    """NeoX's ``split``: ``"969, 30, 1"`` weights of train/valid/test, normalized to fractions. A tuple of
    three fractions that already sum to 1 (what this returns; YAML never gives a tuple) is kept as it is,
    so checking a checked value changes nothing."""
    if (
        isinstance(value, tuple)
        and len(value) == 3
        and all(isinstance(w, float) and math.isfinite(w) and w >= 0 for w in value)
        and abs(sum(value) - 1.0) < 1e-9
    ):
        return value  # type: ignore[return-value]
    parts = value.split(",") if isinstance(value, str) else value
    try:
        if isinstance(parts, (str, bytes, dict)) or len(parts) > 3:
            raise TypeError
        weights = [_number(p, float) if not isinstance(p, str) else float(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError('expected three comma-separated weights like "969,30,1"') from None
    if len(weights) == 2:
        weights.append(0.0)
    if len(weights) != 3 or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError('expected three non-negative comma-separated weights like "969,30,1"')
    total = sum(weights)
    return (weights[0] / total, weights[1] / total, weights[2] / total)


def mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("expected a mapping of keys to values")
    return dict(value)


def plan(value: Any) -> str | dict[str, Any]:
    if isinstance(value, (str, dict)):
        return value
    raise ValueError("expected a preset name (zerotopo, zero3, ...) or a mapping of degrees")


def betas(value: Any) -> tuple[float, float]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        b = tuple(_number(v, float) for v in value)
        if all(0.0 <= x < 1.0 for x in b):
            return b  # type: ignore[return-value]
    raise ValueError("expected two numbers in [0, 1), like [0.9, 0.95]")


def int_list(value: Any) -> tuple[int, ...]:
    """A list of non-negative integers (a single integer is a list of one)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = tuple(_number(v, int) for v in items)
    if any(v < 0 for v in out):
        raise ValueError("expected non-negative integers")
    return out


def weights(value: Any) -> tuple[float, ...]:
    """NeoX's ``*_data_weights``: non-negative numbers with a positive sum."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = tuple(_number(v, float) for v in items)
    if not out or any(v < 0 for v in out) or sum(out) <= 0:
        raise ValueError("expected non-negative weights with a positive sum, like [0.7, 0.3]")
    return out
