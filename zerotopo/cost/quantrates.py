"""The block quantizer's rates by input dtype, code and pass, and the passes one collective runs.

A quantized collective runs two kinds of kernel on each rank: a *quantize* pass over the values it sends
(fp32 or bf16 in, int8 or int4 codes and fp32 scales out) and a *dequantize* pass over what it receives
(codes in, values out; for int4 the fused dequantize-and-sum of the received rows). Their rates differ
by input dtype (a bf16 value is converted before it is scaled) and by pass, so a table of rates in
values per second, one per ``(input dtype, code, pass)``, prices them (:func:`passes_time`);
``zerotopo calibrate`` measures it (:func:`zerotopo.cost.rates.measure_quant_rates`) into the
calibration table's ``device.quantizer`` section::

    device:
      quantizer:            # G values per second
        fp32: {int8: {quantize: 1.9, dequantize: 3.1}, int4: {quantize: 1.2, dequantize: 2.0}}
        bf16: {int8: {quantize: 0.7, dequantize: 2.9}, int4: {quantize: 0.5, dequantize: 1.8}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zerotopo.errors import ConfigError, short

VALUE_DTYPES = {"fp32": 4, "bf16": 2}
"""Input dtypes the quantizer takes, by name, with their bytes per value."""
CODES = ("int8", "int4")
PASSES = ("quantize", "dequantize")

QuantRates = tuple[tuple[str, str, str, float], ...]
"""``(input dtype, code, pass, G values per second)`` rows: hashable, so a frozen device can hold it."""


def value_dtype(value_bytes: int) -> str:
    """The quantizer's input dtype for values ``value_bytes`` wide (fp16 is priced as bf16, its width)."""
    return "fp32" if value_bytes >= 4 else "bf16"


def pass_numels(code: str, group_size: int, quant_numel: int) -> tuple[int, int]:
    """(values quantized, values dequantized) on one rank in one call of a collective that passes the
    quantizer over ``quant_numel`` values (:attr:`zerotopo.placement.schedule.Collective.quant_numel`).

    int8 gather over ``d`` ranks (``quant_numel = n + n/d``; a whole-unit secondary has ``d = 1`` and
    ``quant_numel = 2n``): quantize the rank's ``n/d``, dequantize the gathered ``n``. int4
    reduce-scatter hop (``quant_numel = 2n``): quantize the ``n`` values sent, dequantize-and-sum the
    ``n`` received."""
    if code == "int4":
        n = quant_numel // 2
        return n, n
    d = max(1, group_size)
    n = quant_numel * d // (d + 1)
    return n // d, n


def _name(key: Any) -> str:
    return str(key)[:60]


def rates_from_mapping(raw: Any, source: str = "<calibration>", key: str = "device.quantizer") -> QuantRates:
    """Validate a ``{dtype: {code: {pass: G values/s}}}`` mapping; every entry present must be a
    positive number, every name known. Returns the rows of :data:`QuantRates`."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            f"expected a mapping of input dtype ({', '.join(VALUE_DTYPES)}) to codes, found {short(raw)}",
            source=source,
            key=key,
        )
    rows = []
    for dtype, codes in raw.items():
        if dtype not in VALUE_DTYPES:
            raise ConfigError(f"unknown input dtype; expected {', '.join(VALUE_DTYPES)}", source=source,
                              key=f"{key}.{_name(dtype)}")  # fmt: skip
        if not isinstance(codes, Mapping) or not codes:
            raise ConfigError(f"expected a mapping of code ({', '.join(CODES)}) to passes, found {short(codes)}",
                              source=source, key=f"{key}.{dtype}")  # fmt: skip
        for code, passes in codes.items():
            where = f"{key}.{dtype}.{_name(code)}"
            if code not in CODES:
                raise ConfigError(f"unknown code; expected {', '.join(CODES)}", source=source, key=where)
            if not isinstance(passes, Mapping) or not passes:
                raise ConfigError(f"expected a mapping of pass ({', '.join(PASSES)}) to G values/s, found "
                                  f"{short(passes)}", source=source, key=where)  # fmt: skip
            for name, rate in passes.items():
                if name not in PASSES:
                    raise ConfigError(f"unknown pass; expected {', '.join(PASSES)}", source=source,
                                      key=f"{where}.{_name(name)}")  # fmt: skip
                ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < 1e9
                if not ok:
                    raise ConfigError(f"expected G values per second > 0 (below 1e9), found {short(rate)}",
                                      source=source, key=f"{where}.{name}")  # fmt: skip
                rows.append((dtype, code, name, float(rate)))
    return tuple(rows)


def rates_to_mapping(rates: QuantRates) -> dict[str, dict[str, dict[str, float]]]:
    """The nested mapping :func:`rates_from_mapping` reads."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for dtype, code, name, rate in rates:
        out.setdefault(dtype, {}).setdefault(code, {})[name] = rate
    return out


def lookup(rates: QuantRates, dtype: str, code: str) -> tuple[float, float] | None:
    """(quantize, dequantize) G values/s of ``dtype`` values in ``code``; None unless both are known."""
    got = {name: rate for d, c, name, rate in rates if d == dtype and c == code}
    if "quantize" in got and "dequantize" in got:
        return got["quantize"], got["dequantize"]
    return None


def passes_time(
    rates: QuantRates, code: str, value_bytes: int, group_size: int, quant_numel: int
) -> float | None:
    """Seconds of one call's quantizer passes at ``rates`` (:func:`pass_numels` values at each pass's
    rate for the input dtype of ``value_bytes``); None when the table lacks that dtype and code."""
    got = lookup(rates, value_dtype(value_bytes), code)
    if got is None:
        return None
    q, dq = pass_numels(code, group_size, quant_numel)
    return (q / got[0] + dq / got[1]) / 1e9
