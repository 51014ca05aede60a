"""The quantizer's Triton kernels on a real device (``gpu`` lane; skipped with the reason on CPU).

1. Native runs give the CPU reference's bits: codes, scales, values, the int4 reduction's sums, on the
   inputs of the interpreter tests (tests/comm/triton_interp_cases.py: ragged tails, zero, NaN, ±Inf,
   tie and denormal blocks), for fp32, bf16 and fp16.
2. Achieved bandwidth of each kernel (bytes moved, as the cost model counts them, over the median time)
   as a fraction of the device's memory bandwidth from its topology file (MI250X GCD: frontier, A100:
   dgx-a100, H100: dgx-h100, H200: dgx-h200, ...), and the roofline's predicted time beside the measured one. Goal: at
   least half. Printed, not asserted: timings are not test assertions in this project.

Run with ``pytest -m gpu tests/gpu/test_triton_kernels.py -s``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.comm.triton_interp_cases import DTYPES, same, special
from zerotopo.comm import quant as Q
from zerotopo.placement import volume

pytestmark = pytest.mark.gpu
BLOCK = 256
NUMEL = 1 << 26  # 64 Mi values: 128-256 MiB per pass, far beyond any cache


def _device_bandwidth() -> tuple[float, str]:
    """GB/s of this device's memory from the built-in topology whose device it is, else measured copy."""
    from benchmarks.quant_bench import copy_bandwidth
    from zerotopo.placement.topology import builtin_topologies, load_topology

    name = torch.cuda.get_device_name()
    keys = {"MI250X": "frontier", "A100": "dgx-a100", "H100": "dgx-h100", "H200": "dgx-h200", "A800": "a800"}
    for key, topo in keys.items():
        if key in name and topo in builtin_topologies():
            return load_topology(topo).device.memory_bandwidth_gbps, f"{topo}.yaml"
    return copy_bandwidth(torch.device("cuda"), NUMEL), "measured copy (no topology names this device)"


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_gpu_triton_kernels_match_the_cpu_reference(bits: int, dtype: str) -> None:
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'zerotopo[gpu]')")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to the reference would be a warning
        for block, rows, n in ((2, 3, 15), (6, 4, 61), (256, 3, 1000), (5000, 2, 9001), (256, 8, 1 << 20)):
            x = special(rows, n, block, DTYPES[dtype], seed=block + bits)
            ref = Q.quantize_rows(x, bits, block, kernels="reference")
            got = Q.quantize_rows(x.cuda(), bits, block, kernels="triton")
            assert same(got.data.cpu(), ref.data) and same(got.scales.cpu(), ref.scales), (block, n)
            for out_dtype in (x.dtype, torch.float32, torch.bfloat16):
                ref.dtype = got.dtype = out_dtype
                want = Q.dequantize(ref, kernels="reference")
                assert same(Q.dequantize(got, kernels="triton").cpu(), want), (block, n, out_dtype)
            assert same(Q.dequantize_reduce(got, kernels="triton").cpu(), Q.dequantize_reduce(ref)), (
                block,
                n,
            )


def _median_seconds(fn, iters: int = 20) -> float:
    fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def _report(x: torch.Tensor, bits: int, peak: float) -> None:
    """Time each kernel on ``x`` (``d`` rows) and print its bandwidth against ``peak`` and the roofline."""
    d, numel, vb = x.shape[0], x.numel(), x.element_size()
    q = Q.quantize_rows(x, bits, BLOCK, kernels="triton")
    payload = volume.int8_payload(numel, BLOCK) if bits == 8 else volume.int4_payload(numel, BLOCK)
    out = torch.empty_like(x)
    cases = [
        ("quantize", volume.quantize_traffic(numel, payload, vb),
         lambda: Q.quantize_rows(x, bits, BLOCK, kernels="triton")),
        ("dequantize", volume.dequantize_traffic(numel, payload, vb),
         lambda: Q.dequantize(q, out=out, kernels="triton")),
    ]  # fmt: skip
    if bits == 4:
        traffic = volume.dequantize_reduce_traffic(numel, d, payload)
        cases.append(("dequantize_reduce", traffic, lambda: Q.dequantize_reduce(q, kernels="triton")))
    for op, nbytes, fn in cases:
        t = _median_seconds(fn)
        gbs = nbytes / t / 1e9
        print(
            f"  {op:<18} int{bits} {str(x.dtype)[6:]:<9} {nbytes / 2**20:8.0f} MiB  {t * 1e3:7.3f} ms "
            f"(roofline {nbytes / peak / 1e6:7.3f} ms)  {gbs:6.0f} GB/s = {gbs / peak:4.0%} of {peak:.0f}"
        )


def test_gpu_triton_kernels_bandwidth() -> None:
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'zerotopo[gpu]')")
    peak, source = _device_bandwidth()
    print(f"\n{torch.cuda.get_device_name()}: memory bandwidth {peak:.0f} GB/s ({source})")
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(8, NUMEL // 8, device="cuda").to(dtype)  # 8 rows: a node's gradient group
        for bits in (8, 4):
            _report(x, bits, peak)
    assert not any(v is None for k, v in Q._compiled.items() if k.startswith("triton")), Q._compiled
