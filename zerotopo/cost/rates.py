"""This machine's compute and quantizer rates, measured for ``zerotopo calibrate``'s ``device:`` section.

- ``compute_tflops``: the rate of the matrix multiplies a transformer layer is made of, timed on a
  ``[tokens, hidden] @ [hidden, 4·hidden]`` product (the MLP's first matrix, where the FLOPs are), in
  the dtype training computes in (bf16 on a GPU, fp32 on CPU ranks). The cost model divides a step's
  FLOPs by it (:attr:`zerotopo.cost.planner.CostOptions.achieved_tflops`) instead of peak × efficiency.
- ``quant_gbps``: the block quantizer's rate in GB/s of fp32 values, one int8 quantize and one
  dequantize of a vector (:func:`zerotopo.cost.time.quantizer_time` charges a collective's
  ``quant_numel × 4`` bytes at it).

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


def measure_device(repeats: int = 3) -> dict[str, float]:
    """The ``device:`` section of a calibration table."""
    return {
        "compute_tflops": round(measure_compute_tflops(repeats=repeats), 4),
        "quant_gbps": round(measure_quant_gbps(repeats=repeats), 4),
    }
