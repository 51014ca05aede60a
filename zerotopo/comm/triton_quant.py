"""The block quantizer's device kernels in Triton: one source for CUDA and ROCm.

[Note: Triton kernels] These kernels compute exactly what the reference in :mod:`zerotopo.comm.quant`
computes (its module docstring defines the format), in the same fp32 operations and the same order, so
their codes and scales are bit-identical to it:

- ``scale = absmax / qmax`` and ``code = rint(x / scale)``, both as IEEE round-to-nearest divisions
  (``tl.div_rn``; Triton's ``/`` may be an approximate division on a GPU), ``rint`` rounding half to even
  as ``torch.round`` does;
- a block holding NaN or ±Inf gets a NaN scale and zero codes, so it dequantizes to NaN in every element
  (the NaN test is explicit: a GPU's ``max`` may drop NaN operands); a zero block gets scale 0 and zero
  codes;
- dequantization is one fp32 product ``code · scale`` rounded once to the output type;
- the fused dequantize-and-reduce of the int4 all-to-all adds the sources' products in position order,
  ``((p0 + p1) + p2) + …``, as :func:`zerotopo.comm.quant.dequantize_reduce` does.

Every launch passes ``enable_fp_fusion=False``: a fused multiply-add would round once where the reference
rounds twice. Denormal inputs are exact in the interpreter; on a device they rely on the backend not
flushing fp32 denormals (Triton's default), which only the GPU lane (tests/gpu) can check.

``TRITON_INTERPRET=1`` (set before Triton is imported) runs the same kernels on CPU tensors, which is how
the tests prove bit-exactness on a machine without a GPU; :mod:`zerotopo.comm.triton_aot` compiles them for
AMD and NVIDIA targets ahead of time. This module imports Triton: :mod:`zerotopo.comm.quant` imports it
only when a device tensor asks for the ``triton`` kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Elements one program holds per loaded tile (a block larger than this is processed in chunks).
TILE = 1024
#: Elements one program of the element-wise kernels handles.
ELEMENTS = 1024
NUM_WARPS = 4


@triton.jit
def _load(x_ptr, rowoff, col, m):
    """Elements ``col`` of the rows starting at ``rowoff``, as fp32 by value (masked ones: 0). bf16 is
    widened on its bits (exact, as on a device; the interpreter's own conversion mangles subnormals)."""
    if x_ptr.dtype.element_ty == tl.bfloat16:
        u16 = x_ptr.to(tl.pointer_type(tl.uint16), bitcast=True)
        b = tl.load(u16 + rowoff[:, None] + col, mask=m, other=0)
        return (b.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return tl.load(x_ptr + rowoff[:, None] + col, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _block_scale(x_ptr, rowoff, start, inrow, n, block, QMAX: tl.constexpr, CHUNK: tl.constexpr,
                 PAIRS: tl.constexpr):  # fmt: skip
    """Scale of each of the tile's blocks (fp32, NaN when the block holds NaN or ±Inf)."""
    amax = tl.zeros([rowoff.shape[0]], dtype=tl.float32)
    bad = tl.zeros([rowoff.shape[0]], dtype=tl.int32)
    step = CHUNK * (2 if PAIRS else 1)
    for k0 in tl.range(0, block, step):
        for half in tl.static_range(2 if PAIRS else 1):
            k = k0 + half + tl.arange(0, CHUNK)[None, :] * (2 if PAIRS else 1)
            col = start[:, None] + k
            m = inrow[:, None] & (k < block) & (col < n)
            a = tl.abs(_load(x_ptr, rowoff, col, m))
            bad = tl.maximum(bad, tl.max(((a != a) | (a == float("inf"))).to(tl.int32), axis=1))
            amax = tl.maximum(amax, tl.max(tl.where(a == a, a, 0.0), axis=1))
    scale = tl.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32))
    return tl.where(bad != 0, float("nan"), scale)


#: 1.5 * 2**23: adding it to an fp32 of magnitude below 2**22 leaves no fraction bits, so the sum is rounded
#: to an integer, half to even; subtracting it again is exact.
_ROUNDER = tl.constexpr(12582912.0)


@triton.jit
def _rint(v):
    """Round half to even (``torch.round``) for ``|v| < 2**22``, the codes' range (the interpreter has no
    ``libdevice.rint``); exact because no launch fuses or reassociates fp32 operations."""
    return (v + _ROUNDER) - _ROUNDER


@triton.jit
def _codes(x, scale, QMAX: tl.constexpr):
    """int32 codes of ``x`` (fp32, ``(rows, k)``) in blocks of ``scale`` (``(rows,)``)."""
    usable = (scale == scale) & (scale > 0)
    divisor = tl.where(usable, scale, 1.0)
    q = _rint(tl.div_rn(x, divisor[:, None]))
    q = tl.where(usable[:, None], q, 0.0)
    return tl.minimum(tl.maximum(q, -QMAX), QMAX).to(tl.int32)


@triton.jit
def _quantize_kernel(x_ptr, data_ptr, scale_ptr, rows, n, stride, nblocks, nbytes, block,
                     BITS: tl.constexpr, BLOCKS: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """``BLOCKS`` blocks per program: their scales, then their codes (int8, or int4 pairs packed low
    nibble first as ``code + 8``; an int4 block has an even length, so no byte straddles two blocks)."""
    QMAX: tl.constexpr = 127 if BITS == 8 else 7
    PAIRS: tl.constexpr = BITS == 4
    g = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    inrow = g < rows * nblocks
    row = g // nblocks
    start = (g % nblocks) * block
    rowoff = row * stride
    scale = _block_scale(x_ptr, rowoff, start, inrow, n, block, QMAX, CHUNK, PAIRS)
    tl.store(scale_ptr + g, scale, mask=inrow)
    step = CHUNK * (2 if PAIRS else 1)
    for k0 in tl.range(0, block, step):
        if PAIRS:
            k = k0 + 2 * tl.arange(0, CHUNK)[None, :]
            col = start[:, None] + k
            m_lo = inrow[:, None] & (k < block) & (col < n)
            m_hi = inrow[:, None] & (k + 1 < block) & (col + 1 < n)
            lo = _codes(_load(x_ptr, rowoff, col, m_lo), scale, QMAX)
            hi = _codes(_load(x_ptr, rowoff, col + 1, m_hi), scale, QMAX)
            byte = ((lo + 8) | ((hi + 8) << 4)).to(tl.uint8)
            tl.store(data_ptr + row[:, None] * nbytes + col // 2, byte, mask=m_lo)
        else:
            k = k0 + tl.arange(0, CHUNK)[None, :]
            col = start[:, None] + k
            m = inrow[:, None] & (k < block) & (col < n)
            codes = _codes(_load(x_ptr, rowoff, col, m), scale, QMAX)
            tl.store(data_ptr + row[:, None] * nbytes + col, codes.to(tl.int8), mask=m)


@triton.jit
def _load_codes(data_ptr, row, col, nbytes, m, BITS: tl.constexpr):
    """Signed codes (fp32) of elements ``col`` of rows ``row``."""
    if BITS == 8:
        return tl.load(data_ptr + row * nbytes + col, mask=m, other=0).to(tl.float32)
    byte = tl.load(data_ptr + row * nbytes + col // 2, mask=m, other=0).to(tl.int32)
    return (tl.where(col % 2 == 0, byte & 0x0F, byte >> 4) - 8).to(tl.float32)


@triton.jit
def _round_shift(m, s):
    """``m >> s`` rounded to nearest, half to even (``m`` uint32, ``1 <= s <= 31``)."""
    rest = m & ((1 << s) - 1)
    half = 1 << (s - 1)
    q = m >> s
    return q + ((rest > half) | ((rest == half) & ((q & 1) == 1))).to(tl.uint32)


@triton.jit
def _narrow(v, ty: tl.constexpr):
    """``v`` (fp32) as ``ty``, rounded to nearest even as ``Tensor.to`` does, computed on the bits. A
    plain conversion would let a backend fuse it with the product (gfx90a's ``v_fma_mixlo_f16`` rounds
    the exact product to fp16 once, where the reference rounds to fp32 first), and the interpreter's
    own bf16 conversion truncates."""
    if ty == tl.bfloat16:
        r = _to_bf16(v)
    elif ty == tl.float16:
        r = _to_fp16(v)
    else:
        r = v
    return r


@triton.jit
def _to_bf16(v):
    b = v.to(tl.uint32, bitcast=True)
    r = tl.where(v != v, 0x7FC0, _round_shift(b, 16))  # NaN stays NaN (rounding could carry it to Inf)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_fp16(v):
    b = v.to(tl.uint32, bitcast=True)
    sign = (b >> 16) & 0x8000
    e = ((b >> 23) & 0xFF).to(tl.int32)
    # fp16 normals (fp32 exponent 113..142): drop 13 mantissa bits; a carry moves into the exponent and
    # past 65504 into Inf. Subnormals (102..112): the value in units of 2**-24 is m >> (126 - e).
    normal = ((e - 112).to(tl.uint32) << 23) | (b & 0x7FFFFF)  # rebiased exponent above fp32's mantissa
    m = (b & 0x7FFFFF) | 0x800000
    h = tl.where(e >= 113, _round_shift(normal, 13), _round_shift(m, tl.minimum(tl.maximum(126 - e, 14), 24)))
    h = tl.where(e < 102, 0, h)
    h = tl.where(e >= 143, 0x7C00, h)  # 65536 and beyond, and Inf
    h = tl.where(v != v, 0x7E00, h)
    return (h | sign).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _product(data_ptr, scale_ptr, row, col, nblocks, nbytes, block, m, BITS: tl.constexpr):
    """``code · scale`` (fp32) of elements ``col`` of row ``row``."""
    c = _load_codes(data_ptr, row, col, nbytes, m, BITS)
    return c * tl.load(scale_ptr + row * nblocks + col // block, mask=m, other=0.0)


@triton.jit
def _dequantize_kernel(data_ptr, scale_ptr, out_ptr, rows, n, nblocks, nbytes, block,
                       BITS: tl.constexpr, ELEMS: tl.constexpr):  # fmt: skip
    """``out[r, i] = code[r, i] · scale[r, i // block]``, rounded once to the output's type."""
    i = tl.program_id(0) * ELEMS + tl.arange(0, ELEMS)
    m = i < rows * n
    v = _product(data_ptr, scale_ptr, i // n, i % n, nblocks, nbytes, block, m, BITS)
    tl.store(out_ptr + i, _narrow(v, out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _dequantize_reduce_kernel(data_ptr, scale_ptr, out_ptr, rows, n, nblocks, nbytes, block,
                              BITS: tl.constexpr, ELEMS: tl.constexpr):  # fmt: skip
    """``out[i] = Σ_r code[r, i] · scale[r, i // block]`` in fp32, adding rows in order from row 0."""
    col = tl.program_id(0) * ELEMS + tl.arange(0, ELEMS)
    m = col < n
    acc = _product(data_ptr, scale_ptr, 0, col, nblocks, nbytes, block, m, BITS)
    for r in tl.range(1, rows):
        acc += _product(data_ptr, scale_ptr, r, col, nblocks, nbytes, block, m, BITS)
    tl.store(out_ptr + col, acc, mask=m)


# -- launchers ------------------------------------------------------------------------------------------


def _geometry(block: int) -> tuple[int, int]:
    """``(blocks per program, chunk)``: a tile of at most :data:`TILE` elements, whole blocks when they fit."""
    chunk = min(triton.next_power_of_2(block), TILE)
    return max(1, TILE // chunk), chunk


def quantize(x2: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scales)`` of each row of ``x2`` (2-D, unit stride along rows), as the reference's."""
    rows, n = x2.shape
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    nblocks = -(-n // block)
    nbytes = n if bits == 8 else -(-n // 2)
    data = torch.empty(rows, nbytes, dtype=torch.int8 if bits == 8 else torch.uint8, device=x2.device)
    scales = torch.empty(rows, nblocks, dtype=torch.float32, device=x2.device)
    per, chunk = _geometry(block)
    chunk = chunk // 2 if bits == 4 else chunk  # pairs: each lane loads an even and an odd element
    grid = (triton.cdiv(rows * nblocks, per),)
    _quantize_kernel[grid](
        x2, data, scales, rows, n, x2.stride(0), nblocks, nbytes, block,
        BITS=bits, BLOCKS=per, CHUNK=max(chunk, 1), num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return data, scales


def _sizes(data: torch.Tensor, scales: torch.Tensor, rows: int) -> tuple[int, int]:
    """Blocks and bytes per row."""
    return scales.numel() // rows, data.numel() // rows


def dequantize_into(
    out2: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int
) -> None:
    """Write the ``(rows, n)`` values into ``out2`` (contiguous, any float dtype)."""
    nblocks, nbytes = _sizes(data, scales, rows)
    grid = (triton.cdiv(rows * n, ELEMENTS),)
    _dequantize_kernel[grid](
        data, scales, out2, rows, n, nblocks, nbytes, block,
        BITS=bits, ELEMS=ELEMENTS, num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int, dtype: torch.dtype
) -> torch.Tensor:
    """``(rows, n)`` values of ``dtype``."""
    out = torch.empty(rows, n, dtype=dtype, device=data.device)
    dequantize_into(out, data, scales, rows, n, bits, block)
    return out


def dequantize_reduce(
    data: torch.Tensor, scales: torch.Tensor, rows: int, n: int, bits: int, block: int
) -> torch.Tensor:
    """The fp32 sum over rows of the dequantized ``(rows, n)`` values: ``(n,)``, in one pass."""
    nblocks, nbytes = _sizes(data, scales, rows)
    out = torch.empty(n, dtype=torch.float32, device=data.device)
    _dequantize_reduce_kernel[(triton.cdiv(n, ELEMENTS),)](
        data, scales, out, rows, n, nblocks, nbytes, block,
        BITS=bits, ELEMS=ELEMENTS, num_warps=NUM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def supports(name: str, *args: object) -> bool:
    """Whether the kernel ``name`` takes these arguments (those of the reference function of the same name
    in :mod:`zerotopo.comm.quant`); where not, the reference runs. The kernels index with int32, and an
    int4 block must have an even length (the plan's ``quant_block`` always has)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if any(t.numel() >= 2**31 for t in tensors):
        return False
    if name == "quantize":
        x2, bits, block = args
        return bits == 8 or block % 2 == 0
    return True
