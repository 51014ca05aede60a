"""This machine's compute and quantizer rates, measured for ``zerotopo calibrate``'s ``device:`` section.

- ``compute_tflops``: the rate of the matrix multiplies a transformer layer is made of, timed on a
  ``[tokens, hidden] @ [hidden, 4·hidden]`` product (the MLP's first matrix, where the FLOPs are), in
  the dtype training computes in (bf16 on a GPU, fp32 on CPU ranks). The cost model divides a step's
  FLOPs by it (:attr:`zerotopo.cost.planner.CostOptions.achieved_tflops`) instead of peak × efficiency.
- ``quant_gbps``: the block quantizer's rate in GB/s of fp32 values, one int8 quantize and one
  dequantize of a vector (:func:`zerotopo.cost.time.quantizer_time` charges a collective's
  ``quant_numel × 4`` bytes at it).
- ``quantizer``: the block quantizer's rates in G values per second by input dtype (fp32, bf16), code
  (int8, int4) and pass (quantize; dequantize, the int4 one the reduce-scatter's fused
  dequantize-and-sum of 8 rows), :func:`measure_quant_rates`; the cost model prices each collective's
  passes at them (:mod:`zerotopo.cost.quantrates`).

Each is the best of a few repeats after a warm-up (the least disturbed run of a shared machine).
"""

from __future__ import annotations

import time
from typing import Any


def _best(fn, repeats: int, sync) -> float:
    fn()  # warm up
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _sync_for(device) -> Any:
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def measure_compute_tflops(hidden: int = 1024, tokens: int = 2048, repeats: int = 3, device=None) -> float:
    """TFLOPS of one ``[tokens, hidden] @ [hidden, 4·hidden]`` matrix multiply on ``device``."""
    import torch

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(tokens, hidden, device=device, dtype=dtype)
    b = torch.randn(hidden, 4 * hidden, device=device, dtype=dtype)
    seconds = _best(lambda: a @ b, repeats, _sync_for(device))
    return 2 * tokens * hidden * 4 * hidden / seconds / 1e12


def measure_quant_gbps(numel: int = 1 << 22, block: int = 256, repeats: int = 3, device=None) -> float:
    """GB/s of fp32 values through one int8 block quantize and one dequantize on ``device``."""
    import torch

    from zerotopo.comm.quant import dequantize, quantize_int8

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(numel, device=device)
    seconds = _best(lambda: dequantize(quantize_int8(x, block)), repeats, _sync_for(device))
    return 2 * numel * 4 / seconds / 1e9  # quantize then dequantize: two passes' values, as quant_numel


#: Rows the int4 dequantize pass sums, as the reduce-scatter does one row per rank of its group.
INT4_ROWS = 8


def measure_quant_rates(
    numel: int = 1 << 22, block: int = 256, repeats: int = 3, device=None
) -> dict[str, dict[str, dict[str, float]]]:
    """G values per second of each quantizer pass on ``device``, ``{dtype: {code: {pass: rate}}}``
    (:mod:`zerotopo.cost.quantrates`): ``numel`` fp32 or bf16 values quantized to int8 or int4, and
    dequantized back (int8: to the input dtype; int4: the fused fp32 sum of :data:`INT4_ROWS` rows of
    ``numel / INT4_ROWS`` values, as the all-to-all reduce-scatter receives them)."""
    import torch

    from zerotopo.comm.quant import dequantize, dequantize_reduce, quantize_rows

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = _sync_for(device)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.randn(numel, device=device).to(dtype)
        for code, bits in (("int8", 8), ("int4", 4)):
            rows = x.view(1 if bits == 8 else INT4_ROWS, -1)
            q = quantize_rows(rows, bits, block)
            back = (lambda q=q: dequantize(q)) if bits == 8 else (lambda q=q: dequantize_reduce(q))
            quantize_s = _best(lambda rows=rows, bits=bits: quantize_rows(rows, bits, block), repeats, sync)
            out.setdefault(name, {})[code] = {
                "quantize": round(numel / quantize_s / 1e9, 4),
                "dequantize": round(numel / _best(back, repeats, sync) / 1e9, 4),
            }
    return out


def measure_device(repeats: int = 3) -> dict[str, Any]:
    """The ``device:`` section of a calibration table."""
    return {
        "compute_tflops": round(measure_compute_tflops(repeats=repeats), 4),
        "quant_gbps": round(measure_quant_gbps(repeats=repeats), 4),
        "quantizer": measure_quant_rates(repeats=repeats),
    }
