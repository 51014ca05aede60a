"""Throughput of the block quantizer: reference (plain torch) against the fused (torch.compile) kernels.

    PYTHONPATH=$PWD python benchmarks/quant_bench.py [--numel N] [--dtype bf16] [--device cuda]

For int8 and int4 (blocks of 256, fp32 scales) it times ``quantize_rows`` and ``dequantize`` (into a
preallocated output, as the engine calls it) and prints GB/s, counting the bytes each call must read and
write (input, codes, scales, output). On an accelerator it also prints the fraction of the device's copy
bandwidth (a device-to-device ``copy_`` of the same size, the practical peak) and the transient memory
of each call beyond its output (``torch.cuda.max_memory_allocated``). Compilation happens in an
untimed warm-up call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from zerotopo.comm import quant as Q

BLOCK = 256
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], Any], device: torch.device, iters: int) -> float:
    fn()  # warm-up: compilation, allocator
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _transient(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Peak bytes allocated during ``fn`` beyond what was allocated before it and what it returned."""
    if device.type != "cuda":
        return None
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    _sync(device)
    kept = torch.cuda.memory_allocated(device) - before
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return max(peak - kept, 0)


def copy_bandwidth(device: torch.device, numel: int, iters: int = 5) -> float:
    """GB/s of a same-device fp32 copy (bytes read + written): the practical memory bandwidth."""
    x = torch.randn(numel, device=device)
    y = torch.empty_like(x)
    s = _seconds(lambda: y.copy_(x), device, iters)
    return 2 * x.numel() * x.element_size() / s / 1e9


def bench_one(
    device: torch.device, numel: int, dtype: torch.dtype, bits: int, kernels: str, iters: int = 5
) -> list[dict[str, Any]]:
    """Quantize and dequantize rows (GB/s, transient bytes) with ``kernels``."""
    x = (torch.randn(numel, device=device) * 3).to(dtype).view(1, -1)
    q = Q.quantize_rows(x, bits, BLOCK, kernels=kernels)
    payload = q.data.numel() * q.data.element_size() + q.scales.numel() * 4
    out = torch.empty(numel, dtype=dtype, device=device)
    elem = x.element_size()
    rows = []
    for op, fn, moved, output in (
        (
            "quantize",
            lambda: Q.quantize_rows(x, bits, BLOCK, kernels=kernels),
            numel * elem + payload,
            payload,
        ),
        (
            "dequantize",
            lambda: Q.dequantize(q, out=out, kernels=kernels),
            payload + numel * elem,
            numel * elem,
        ),
    ):
        s = _seconds(fn, device, iters)
        rows.append(
            {
                "op": op,
                "bits": bits,
                "kernels": kernels,
                "seconds": s,
                "gb_s": moved / s / 1e9,
                "transient_bytes": _transient(fn, device),
                "output_bytes": output,
            }
        )
    return rows


def bench_all(
    device: torch.device,
    *,
    numel: int,
    dtype: torch.dtype,
    bits: Sequence[int] = (8, 4),
    kernels: Sequence[str] = ("reference", "compiled"),
    iters: int = 5,
) -> list[dict[str, Any]]:
    return [r for b in bits for k in kernels for r in bench_one(device, numel, dtype, b, k, iters)]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--numel", type=int, default=1 << 24, help="elements per call (default 16M)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=5, help="timed calls; the best is reported")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak = copy_bandwidth(device, args.numel)
    print(
        f"{args.numel} {args.dtype} elements on {device} (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads); copy bandwidth {peak:.1f} GB/s"
    )
    print(f"{'op':<11}{'bits':>5}  {'kernels':<10}{'ms':>9}{'GB/s':>9}{'of copy':>9}{'transient MiB':>15}")
    for r in bench_all(device, numel=args.numel, dtype=DTYPES[args.dtype], iters=args.iters):
        tr = "n/a" if r["transient_bytes"] is None else f"{r['transient_bytes'] / 2**20:.1f}"
        print(
            f"{r['op']:<11}{r['bits']:>5}  {r['kernels']:<10}{r['seconds'] * 1e3:>9.2f}{r['gb_s']:>9.2f}"
            f"{r['gb_s'] / peak:>9.0%}{tr:>15}"
        )
    if not Q.compiled_available("quantize") or not Q.compiled_available("dequantize_into"):
        print("torch.compile failed here: the 'compiled' rows ran the reference code")


if __name__ == "__main__":
    main()
