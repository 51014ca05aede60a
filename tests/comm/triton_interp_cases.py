"""Run the Triton quantization kernels in Triton's interpreter against the reference, on CPU tensors.

Not a test module (tests/gpu/test_triton_kernels.py reuses its inputs on a device): ``tests/comm/test_triton_quant.py`` runs it in a subprocess with ``TRITON_INTERPRET=1``
(the interpreter must be chosen before Triton is imported, which would leak into every other test if it
were set in the test process). Prints one JSON object: case name -> list of mismatches (empty: bit for
bit the reference's codes, scales and values, NaN in the same places).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch

from zerotopo.comm import quant as Q

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every number the same bits, NaN in the same places (a NaN's payload may differ)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = a.isnan()
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(bits)[~nan], b.view(bits)[~nan])


def special(rows: int, n: int, block: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows of several magnitudes, with a NaN block, a +Inf and a -Inf block, an all-zero block,
    a block of exact half-step ties, and a block too small for a normal scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * torch.logspace(-2, 2, rows).unsqueeze(1)
    nb = -(-n // block)
    put = {0: float("nan"), 1: float("inf"), 2: float("-inf")}
    for k, (r, b) in enumerate((r, b) for r in range(rows) for b in range(nb)):
        lo, hi = b * block, min(n, (b + 1) * block)
        if k % 7 in put:
            x[r, lo + (k % (hi - lo))] = put[k % 7]
        elif k % 7 == 3:
            x[r, lo:hi] = 0
        elif k % 7 == 4:  # codes land on .5: 127 -> scale 1, values k + 0.5 round half to even
            x[r, lo:hi] = torch.arange(hi - lo).remainder(8) - 3.5
            x[r, lo] = 127.0
        elif k % 7 == 5:
            x[r, lo:hi] *= 1e-38  # denormal scale (fp32 inputs; bf16/fp16 flush it or keep it by value)
    return x.to(dtype)


def check_quantize(x: torch.Tensor, bits: int, block: int) -> list[str]:
    bad = []
    ref = Q.quantize_rows(x, bits, block, kernels="reference")
    got = Q.quantize_rows(x, bits, block, kernels="triton")
    if not same(got.data, ref.data):
        bad.append("codes")
    if not same(got.scales, ref.scales):
        bad.append("scales")
    for dtype in {x.dtype, torch.float32, torch.bfloat16}:
        ref.dtype = dtype
        if not same(Q.dequantize(ref, kernels="triton"), Q.dequantize(ref, kernels="reference")):
            bad.append(f"dequantize to {dtype}")
        a = torch.empty(x.numel(), dtype=dtype)
        b = torch.empty(x.numel(), dtype=dtype)
        if not same(
            Q.dequantize(ref, out=a, kernels="triton"), Q.dequantize(ref, out=b, kernels="reference")
        ):
            bad.append(f"dequantize into {dtype}")
    if x.shape[0] > 1 and not same(Q.dequantize_reduce(ref, kernels="triton"), Q.dequantize_reduce(ref)):
        bad.append("dequantize_reduce")
    return bad


def check_nan_rule(bits: int) -> list[str]:
    """The documented non-finite rule, on the kernels' own output: a block holding NaN or Inf gets a NaN
    scale and comes back as NaN everywhere; its neighbours are untouched; a zero block is exact zeros."""
    x = torch.ones(1, 32)
    x[0, 3], x[0, 12], x[0, 24:32] = float("nan"), float("-inf"), 0
    q = Q.quantize_rows(x, bits, 8, kernels="triton")
    out = Q.dequantize(q, kernels="triton").view(-1)
    bad = []
    if not (q.scales[0, :2].isnan().all() and out[:16].isnan().all()):
        bad.append("non-finite blocks are not all NaN")
    if not torch.equal(out[16:24], torch.ones(8)) or q.scales[0, 2] != torch.tensor(1.0) / Q.QMAX[bits]:
        bad.append("a finite neighbour changed")
    if not (q.scales[0, 3].item() == 0 and torch.equal(out[24:], torch.zeros(8))):
        bad.append("zero block")
    return bad


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1 (on CPU tensors the kernels run only in the interpreter)")
    # A kernel that failed would fall back to the reference with a warning and compare it with itself:
    # make that an error instead.
    warnings.simplefilter("error", RuntimeWarning)
    results: dict[str, list[str]] = {}
    for bits in (8, 4):
        results[f"nan-rule int{bits}"] = check_nan_rule(bits)
        # block: 2 (smallest), 6 (not a power of two), 256 (the plan's default), 5000 (chunked, over a tile)
        for block, rows, n in ((2, 3, 15), (6, 4, 61), (256, 3, 1000), (5000, 2, 9001)):
            for name, dtype in DTYPES.items():
                x = special(rows, n, block, dtype, seed=block + bits)
                results[f"int{bits} block {block} {name} {rows}x{n}"] = check_quantize(x, bits, block)
    if any(fn is None for fn in Q._compiled.values()):
        sys.exit(f"a Triton kernel fell back to the reference: {Q._compiled}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
