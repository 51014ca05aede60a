"""Block-wise symmetric quantization: int8, and int4 packed two per byte, with one fp32 scale per block.

Pure torch: the same code runs on CPU, CUDA and ROCm. [Note: fused kernels] The reference code makes
about ten passes over the data with fp32 temporaries of the padded input; :func:`quantize_rows` and
:func:`dequantize` can instead run the same code through ``torch.compile`` (Inductor: Triton on a GPU,
C++ on a CPU), which fuses it into a reduction and a pointwise pass for quantization and one pass for
dequantization, with no temporary larger than the output. The device kernels proper are Triton
(:mod:`zerotopo.comm.triton_quant`, [Note: Triton kernels]): one pass per block for quantization, one
for dequantization, and one for the int4 reduce-scatter's dequantize-and-sum
(:func:`dequantize_reduce`). ``ZEROTOPO_QUANT_KERNELS`` picks: ``auto`` (default: ``triton`` on a
CUDA or ROCm device when Triton is installed, the reference there otherwise, with a one-line notice;
the reference on CPU, where a compile costs more than it saves in the short tests), ``triton``,
``compiled`` or ``reference``. When compiling or launching fails (no compiler, an unsupported platform,
a CPU tensor without ``TRITON_INTERPRET=1``) the reference runs instead, with one warning. The reference
and the Triton kernels give bit-identical results on CPU and device (every number the same bits, NaN in
the same places; a NaN's payload bits may differ): tested on CPU (Triton's through its interpreter) and
on an NVIDIA H200. ``compiled`` is bit-identical on CPU; on a GPU Inductor divides its own way (scales
one rounding off, codes one step off, measured on the H200).

A block of ``block`` consecutive elements gets ``scale = absmax / qmax`` (``qmax`` 127 for int8, 7 for
int4) and codes ``round(x / scale)`` in ``[-qmax, qmax]``; ``x̂ = code · scale``. So:

- every element is within half a step of its block, ``|x - x̂| ≤ scale / 2`` (plus one fp32 rounding);
- a zero block has scale 0 and comes back as exact zeros (no 0/0);
- ``±absmax`` maps to ``±qmax`` exactly, so a constant block's codes are exact; its values come back
  exactly in bf16/fp16 and within one fp32 rounding of ``qmax · scale`` in fp32;
- [Note: non-finite blocks] a block holding NaN or ±Inf gets a NaN scale and dequantizes to NaN in every
  element. A non-finite gradient is never silently turned into numbers (an overflow check downstream
  still sees it); the other blocks are unaffected.

Inputs may be fp32, bf16 or fp16 and are converted to fp32 by value (``.float()``) before any
arithmetic. bf16 bits are never reinterpreted as fp16 (a DeepSpeed quantizer bug that gives garbage for
bf16 models). The last block of a tensor whose length is not a multiple of ``block`` is shorter: it is
padded with zeros for the arithmetic, and the padding is neither stored nor sent.

Layout of :class:`Quantized`: ``data`` holds one code per element (int8), or two per byte (uint8: the
even element in the low nibble, the odd one in the high nibble, each stored as ``code + 8``); ``scales``
one fp32 per block. A batch of ``rows`` equal-length rows (one per destination rank in the quantized
collectives) quantizes each row on its own, so no block straddles two ranks' chunks.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

QMAX = {8: 127, 4: 7}
SCALE_BYTES = 4


@dataclass
class Quantized:
    """A block-quantized tensor (or ``rows`` equal rows of one)."""

    data: torch.Tensor
    """int8 codes, or uint8 with two int4 codes per byte; shape ``(bytes,)`` or ``(rows, bytes)``."""
    scales: torch.Tensor
    """fp32 scale per block; shape ``(blocks,)`` or ``(rows, blocks)``."""
    numel: int
    """Elements represented (all rows together)."""
    bits: int
    """8 or 4."""
    block: int
    """Elements per block."""
    dtype: torch.dtype
    """Floating-point type of the original tensor (the default type of :func:`dequantize`)."""
    rows: int = 1
    """Independent rows, each ``numel // rows`` elements."""


def _check(x: torch.Tensor, block: int, bits: int) -> None:
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a floating-point tensor, got {x.dtype}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block size must be a positive integer, got {block!r}")
    if bits not in QMAX:
        raise ValueError(f"bits must be 8 or 4, got {bits!r}")


def _codes_and_scales(x2: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (int8, ``(rows, n)``) and scales (fp32, ``(rows, blocks)``) of each row of ``x2``."""
    rows, n = x2.shape
    nblocks = -(-n // block)
    qmax = QMAX[bits]
    x_RNB = F.pad(x2.float(), (0, nblocks * block - n)).view(rows, nblocks, block)  # by value, never bits
    absmax = x_RNB.abs().amax(-1)  # NaN propagates; Inf stays Inf
    # A tensor divisor, never the Python number: CUDA divides a tensor by a CPU scalar as a product with
    # its reciprocal, one rounding off the true quotient that the CPU and the Triton kernels compute.
    scale = absmax / torch.full_like(absmax, qmax)
    finite = torch.isfinite(scale)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    usable = finite & (scale > 0)
    divisor = torch.where(usable, scale, torch.ones_like(scale))
    q = torch.round(x_RNB / divisor.unsqueeze(-1))
    # Zero codes in non-finite blocks: the NaN scale carries the block's state; NaN must not reach .to(int8).
    q = torch.where(usable.unsqueeze(-1), q, torch.zeros_like(q)).clamp_(-qmax, qmax)
    return q.to(torch.int8).view(rows, nblocks * block)[:, :n], scale


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    """``(rows, n)`` int8 codes in [-7, 7] -> ``(rows, ceil(n/2))`` uint8, low nibble first."""
    rows, n = codes.shape
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    if n % 2:
        u = F.pad(u, (0, 1), value=8)
    u = u.view(rows, -1, 2)
    return u[..., 0] | (u[..., 1] << 4)


def _unpack4(data: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`_pack4`: ``(rows, bytes)`` uint8 -> ``(rows, n)`` int8 codes."""
    lo = (data & 0x0F).to(torch.int8) - 8
    hi = (data >> 4).to(torch.int8) - 8
    return torch.stack((lo, hi), dim=-1).view(data.shape[0], -1)[:, :n]


def _quantize_ref(x2: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference quantizer: ``(data, scales)`` of each row of ``x2``."""
    codes, scales = _codes_and_scales(x2, bits, block)
    data = codes.contiguous() if bits == 8 else _pack4(codes)
    return data, scales


def quantize_rows(x2: torch.Tensor, bits: int, block: int, *, kernels: str | None = None) -> Quantized:
    """Quantize each row of a 2-D tensor on its own (blocks restart at every row).

    ``kernels``: ``reference``, ``compiled`` or ``auto`` (default ``$ZEROTOPO_QUANT_KERNELS`` or
    ``auto``; see [Note: fused kernels])."""
    _check(x2, block, bits)
    if x2.dim() != 2:
        raise ValueError(f"quantize_rows expects a 2-D tensor, got shape {tuple(x2.shape)}")
    data, scales = _run("quantize", _quantize_ref, x2.device, kernels)(x2, bits, block)
    return Quantized(data, scales, x2.numel(), bits, block, x2.dtype, rows=x2.shape[0])


def _flat_view(q: Quantized) -> Quantized:
    return Quantized(q.data.view(-1), q.scales.view(-1), q.numel, q.bits, q.block, q.dtype)


def quantize_int8(x: torch.Tensor, block: int) -> Quantized:
    """Symmetric int8 per block of ``block`` elements (``x`` is flattened)."""
    return _flat_view(quantize_rows(x.reshape(1, -1), 8, block))


def quantize_int4(x: torch.Tensor, block: int) -> Quantized:
    """Symmetric int4 per block, two codes per byte (``x`` is flattened)."""
    return _flat_view(quantize_rows(x.reshape(1, -1), 4, block))


def codes(q: Quantized) -> torch.Tensor:
    """The signed codes, ``(rows, numel // rows)`` int8."""
    n = q.numel // q.rows
    data = q.data.view(q.rows, -1)
    return data[:, :n] if q.bits == 8 else _unpack4(data, n)


def _dequantize_ref(
    data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int, dtype: torch.dtype
) -> torch.Tensor:
    """The reference dequantizer: ``(rows, n)`` values of ``dtype``."""
    c = data.view(rows, -1)[:, :n] if bits == 8 else _unpack4(data.view(rows, -1), n)
    nblocks = scales.numel() // rows
    c_RNB = F.pad(c.float(), (0, nblocks * block - n)).view(rows, nblocks, block)
    return (c_RNB * scales.view(rows, nblocks, 1)).view(rows, -1)[:, :n].to(dtype)


def _dequantize_reduce_ref(
    data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int
) -> torch.Tensor:
    """The reference of :func:`dequantize_reduce`: rows added one at a time, in order."""
    x = _dequantize_ref(data, scales, rows, n, bits, block, torch.float32)
    acc = x[0].clone()
    for r in range(1, rows):
        acc += x[r]
    return acc


def dequantize_reduce(q: Quantized, *, kernels: str | None = None) -> torch.Tensor:
    """The fp32 sum of the dequantized rows of ``q``: ``(numel // rows,)``, adding row 0, then row 1, ...
    in that order (a fixed order, so every kernel gives the same bits; ``Tensor.sum`` picks its own).
    The Triton kernel does it in one pass, without the ``(rows, n)`` fp32 temporary. ``kernels`` as for
    :func:`quantize_rows`."""
    args = (q.data, q.scales, q.rows, q.numel // q.rows, q.bits, q.block)
    return _run("dequantize_reduce", _dequantize_reduce_ref, q.data.device, kernels)(*args)


def _dequantize_into_ref(
    out2: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int
) -> None:
    """:func:`_dequantize_ref` written into ``out2`` (``(rows, n)``, contiguous): the compiled version
    writes the output in its one pass, with no temporary."""
    out2.copy_(_dequantize_ref(data, scales, rows, n, bits, block, torch.float32))


def dequantize(q: Quantized, out: torch.Tensor | None = None, *, kernels: str | None = None) -> torch.Tensor:
    """Back to floating point: ``q.dtype`` by default, or written into ``out`` (any float dtype,
    ``numel`` elements, any shape). Row-batched inputs come back as ``(rows, numel // rows)``.
    ``kernels`` as for :func:`quantize_rows`."""
    n = q.numel // q.rows
    args = (q.data, q.scales, q.rows, n, q.bits, q.block)
    if out is None:
        x = _run("dequantize", _dequantize_ref, q.data.device, kernels)(*args, q.dtype)
        return x.reshape(-1) if q.rows == 1 and q.data.dim() == 1 else x
    if out.numel() != q.numel:
        raise ValueError(f"dequantize: out has {out.numel()} elements, the quantized tensor {q.numel}")
    if out.is_contiguous():
        _run("dequantize_into", _dequantize_into_ref, q.data.device, kernels)(out.view(q.rows, n), *args)
    else:
        out.copy_(_dequantize_ref(*args, torch.float32).reshape(out.shape))
    return out


# -- kernel selection (see [Note: fused kernels]) ------------------------------------------------------

KERNELS_ENV = "ZEROTOPO_QUANT_KERNELS"
KERNEL_CHOICES = ("auto", "compiled", "reference", "triton")
_compiled: dict[str, Any] = {}  # name -> compiled function, or None once compiling failed


def kernels_for(device: torch.device, kernels: str | None = None) -> str:
    """``triton``, ``compiled`` or ``reference``: what :func:`quantize_rows` and :func:`dequantize` run on
    ``device``."""
    choice = kernels or os.environ.get(KERNELS_ENV, "") or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(
            f"quantization kernels {choice!r} (argument or ${KERNELS_ENV}) is not one of {', '.join(KERNEL_CHOICES)}"
        )
    if choice == "auto":
        choice = "reference" if device.type == "cpu" else "triton"
    return choice


def compiled_available(name: str = "quantize") -> bool:
    """False once compiling ``name`` failed in this process (the reference runs instead)."""
    return _compiled.get(name, True) is not None


def _run(
    name: str, reference: Callable[..., Any], device: torch.device, kernels: str | None
) -> Callable[..., Any]:
    choice = kernels_for(device, kernels)
    if choice == "reference":
        return reference
    if choice == "triton":
        return _run_triton(name, reference)
    if _compiled.get(name, True) is None:
        return reference
    fn = _compiled.get(name)
    if fn is None:
        try:
            fn = torch.compile(reference, dynamic=True, fullgraph=True)
        except Exception as exc:  # noqa: BLE001 - no compiler backend on this platform
            return _give_up(name, reference, exc)
        _compiled[name] = fn
    return _guarded(name, fn, reference)


def _guarded(name: str, fn: Callable[..., Any], reference: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - a compile failure surfaces at the first call
            _give_up(name, reference, exc)
            return reference(*args)

    return call


def _run_triton(name: str, reference: Callable[..., Any]) -> Callable[..., Any]:
    """The Triton kernel of ``name`` (see [Note: Triton kernels]), or the reference where there is none:
    Triton not installed (one notice per process), an earlier launch failed, or an input the kernel
    does not take (:func:`zerotopo.comm.triton_quant.supports`)."""
    key = f"triton:{name}"
    if _compiled.get("triton", True) is None or _compiled.get(key, True) is None:
        return reference
    try:
        module = importlib.import_module("zerotopo.comm.triton_quant")
    except ImportError as exc:
        _compiled["triton"] = None
        warnings.warn(
            f"Triton is not available ({exc}); the reference quantization code runs instead (bit-identical, "
            f"slower). Install the gpu extra (pip install 'zerotopo[gpu]') or set {KERNELS_ENV}=reference.",
            RuntimeWarning,
            stacklevel=3,
        )
        return reference
    kernel = getattr(module, name)

    def call(*args: Any) -> Any:
        if not module.supports(name, *args):
            return reference(*args)
        return _guarded(key, kernel, reference)(*args)

    return call


def _give_up(name: str, reference: Callable[..., Any], exc: BaseException) -> Callable[..., Any]:
    _compiled[name] = None
    what = (
        f"the Triton {name[7:]} kernel"
        if name.startswith("triton:")
        else f"torch.compile of the {name} kernel"
    )
    warnings.warn(
        f"{what} failed ({type(exc).__name__}: {str(exc)[:200]}); the reference "
        f"quantization code runs instead (bit-identical, slower). Set {KERNELS_ENV}=reference to skip the attempt.",
        RuntimeWarning,
        stacklevel=3,
    )
    return reference


def payload_bytes(q: Quantized) -> int:
    """Bytes on the wire: codes plus fp32 scales (``volume.int8_payload`` / ``int4_payload``)."""
    return q.data.numel() * q.data.element_size() + q.scales.numel() * SCALE_BYTES


def pack_payload(q: Quantized) -> torch.Tensor:
    """One uint8 buffer per row, ``(rows, payload)``: the codes, then the scales' bytes."""
    data = q.data.view(q.rows, -1).view(torch.uint8)
    scales = q.scales.reshape(q.rows, -1).contiguous().view(torch.uint8)
    return torch.cat((data, scales), dim=1)


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A dense copy in new storage (offset 0), so its bytes can be viewed as wider types."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def unpack_payload(buf: torch.Tensor, *, numel: int, bits: int, block: int, dtype: torch.dtype) -> Quantized:
    """Inverse of :func:`pack_payload` for ``buf`` of shape ``(rows, payload)``; ``numel`` for all rows."""
    rows = buf.shape[0]
    n = numel // rows
    nbytes = n if bits == 8 else -(-n // 2)
    data = _fresh(buf[:, :nbytes])
    if bits == 8:
        data = data.view(torch.int8)
    scales = _fresh(buf[:, nbytes:]).view(torch.float32)
    return Quantized(data, scales, numel, bits, block, dtype, rows=rows)
