"""Payload codecs of the collectives: how many bytes a gather or a reduction of ``n`` elements sends.

A codec names the wire format of a collective's payload and the ledger op that carries it. The three
quantization booleans of a plan map onto codecs here (``quantize_weights`` -> ``int8`` gathers,
``quantize_grads`` -> ``int4`` reductions, ``secondary_dtype`` -> the backward gather's codec), so a new
wire format is one entry of :data:`CODECS`. Byte counts come from :mod:`zerotopo.placement.volume`, the
functions the runtime ledger uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zerotopo.placement import volume


@dataclass(frozen=True)
class Codec:
    """One wire format."""

    name: str
    """``fp32``, ``bf16``, ``fp16``, ``int8`` or ``int4``."""
    gather_op: str | None
    """Ledger op of an all-gather in this format (None: not used for gathers)."""
    reduce_op: str | None
    """Ledger op of a reduce-scatter in this format (None: not used for reductions)."""
    _gather: Callable[[int, int, int], int] | None
    _reduce: Callable[[int, int, int], int] | None
    _payload: Callable[[int, int], int]
    wire_bytes: float = 0.0
    """Bytes per element on the wire, block scales aside (plain: the width; ``int8`` 1, ``int4`` 0.5)."""
    quantized: bool = False
    """Whether its collectives run the block quantizer (and so stage a quantized copy of the message)."""

    def gather_bytes(self, numel_out: int, d: int, block: int) -> int:
        """Bytes one rank sends in an all-gather into ``numel_out`` elements over ``d`` ranks."""
        if self._gather is None:
            raise ValueError(f"codec {self.name!r} has no all-gather")
        return self._gather(numel_out, d, block)

    def reduce_bytes(self, numel_in: int, d: int, block: int) -> int:
        """Bytes one rank sends in a reduce-scatter of ``numel_in`` elements over ``d`` ranks."""
        if self._reduce is None:
            raise ValueError(f"codec {self.name!r} has no reduce-scatter")
        return self._reduce(numel_in, d, block)

    def payload(self, numel: int, block: int) -> int:
        """Bytes of the whole message of ``numel`` elements in this format (what a bandwidth table is
        indexed by: the gathered output, the reduce-scatter input)."""
        return self._payload(numel, block)

    def temp_bytes(self, numel: int, block: int) -> int:
        """Temporary memory of one collective over ``numel`` elements beyond its input and output: the
        quantized message for a quantized codec (what the receiver dequantizes), nothing for a plain one."""
        return self._payload(numel, block) if self.quantized else 0


def _plain(name: str, width: int) -> Codec:
    return Codec(
        name,
        "all_gather",
        "reduce_scatter",
        lambda n, d, b: volume.all_gather_bytes(n, d, width),
        lambda n, d, b: volume.reduce_scatter_bytes(n, d, width),
        lambda n, b: n * width,
        wire_bytes=float(width),
    )


CODECS: dict[str, Codec] = {
    "fp32": _plain("fp32", 4),
    "bf16": _plain("bf16", 2),
    "fp16": _plain("fp16", 2),
    "int8": Codec(
        "int8",
        "all_gather_int8",
        None,
        volume.int8_all_gather_bytes,
        None,
        volume.int8_payload,
        wire_bytes=1.0,
        quantized=True,
    ),
    "int4": Codec(
        "int4",
        None,
        "reduce_scatter_int4",
        None,
        volume.int4_reduce_scatter_bytes,
        volume.int4_payload,
        wire_bytes=0.5,
        quantized=True,
    ),
}


def codec_for_width(elem_bytes: int) -> Codec:
    """The plain codec of an element width (2 -> ``bf16``, 4 -> ``fp32``)."""
    name = {2: "bf16", 4: "fp32"}.get(elem_bytes)
    if name is None:
        return _plain(f"{8 * elem_bytes}bit", elem_bytes)
    return CODECS[name]


def get_codec(name: str) -> Codec:
    """The codec called ``name`` (a clear error naming the known ones otherwise)."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; codecs are {', '.join(CODECS)}")
    return CODECS[name]


@dataclass(frozen=True)
class PlanCodecs:
    """The codec of each collective a plan runs (see the module note): what the step schedule costs and
    what the engine's units are built with, chosen in one place."""

    gather: Codec
    """All-gathers from the parameter shard (the forward's, and the backward's without a secondary)."""
    secondary: Codec
    """The secondary partition and the backward all-gather from it (when the plan has one)."""
    reduce: Codec
    """The per-micro-batch gradient reduce-scatter."""
    grad_shard: Codec
    """The accumulated gradient shard (its cross-replica reduction)."""
    param: Codec
    """The parameters (the post-step all-gather of the updated chunks)."""


def plan_codecs(
    plan: Any,
    *,
    param_bytes: int,
    reduce_bytes: int,
    grad_shard_bytes: int,
) -> PlanCodecs:
    """The codecs of ``plan`` (a :class:`~zerotopo.placement.plan.Plan`) for weights of ``param_bytes``,
    a gradient reduction in ``reduce_bytes`` and a gradient shard of ``grad_shard_bytes`` per element.
    A plain secondary partition is bf16."""
    pcodec = codec_for_width(param_bytes)
    return PlanCodecs(
        gather=CODECS["int8"] if plan.quantize_weights else pcodec,
        secondary=CODECS["int8"] if plan.secondary_dtype == "int8" else CODECS["bf16"],
        reduce=CODECS["int4"] if plan.quantize_grads else codec_for_width(reduce_bytes),
        grad_shard=codec_for_width(grad_shard_bytes),
        param=pcodec,
    )
