"""The fused (torch.compile) quantization kernels against the reference code: bit for bit, on CPU.

Compiling takes minutes on a small CPU (Inductor builds C++), so this is a ``slow`` test with few
shapes; the GPU lane (tests/gpu) runs the same comparison on the device for every dtype.
"""

from __future__ import annotations

import pytest
import torch

from zerotopo.comm import quant as Q

pytestmark = pytest.mark.slow


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    big = torch.randn(3, 1000, generator=g) * 10
    big[0, 5] = float("nan")  # a NaN block
    big[1, 70:90] = 0  # part of a block zero
    big[1, 128:192] = 0  # a whole zero block
    big[2, 7] = float("-inf")  # an infinite block
    odd = torch.randn(2, 4097, generator=g) * 1e-3  # a short last block
    return [big, odd, torch.full((1, 64), 2.5)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of every number, and NaN in the same places. (A NaN's payload bits may differ:
    Inductor writes the canonical NaN where eager bf16 conversion keeps the fp32 NaN's upper bits.)"""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = a.isnan()
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(bits)[~nan], b.view(bits)[~nan])


@pytest.mark.parametrize("bits", [8, 4])
def test_compiled_quantization_is_bit_identical_to_the_reference(bits: int) -> None:
    for x in _inputs():
        ref = Q.quantize_rows(x, bits, 64, kernels="reference")
        got = Q.quantize_rows(x, bits, 64, kernels="compiled")
        if not Q.compiled_available("quantize"):
            pytest.skip("torch.compile does not work on this machine (the reference ran instead)")
        assert _same(got.data, ref.data) and _same(got.scales, ref.scales)
        assert _same(Q.dequantize(ref, kernels="compiled"), Q.dequantize(ref, kernels="reference"))
        a, b = torch.empty(x.numel(), dtype=torch.bfloat16), torch.empty(x.numel(), dtype=torch.bfloat16)
        Q.dequantize(ref, out=a, kernels="compiled")
        Q.dequantize(ref, out=b, kernels="reference")
        assert _same(a, b)


def test_kernel_choice() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    # a device runs the Triton kernels by default (the reference where Triton is missing: see
    # tests/comm/test_triton_quant.py); "triton" became a choice, so the refused name is another one
    assert Q.kernels_for(cpu) == "reference" and Q.kernels_for(cuda) == "triton"
    assert Q.kernels_for(cpu, "compiled") == "compiled"
    with pytest.raises(ValueError, match="not one of auto, compiled, reference, triton"):
        Q.kernels_for(cpu, "cuda")


def test_a_failed_compile_falls_back_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(Q, "_compiled", {})
    x = torch.randn(2, 100)
    with pytest.warns(RuntimeWarning, match="reference quantization code runs instead"):
        q = Q.quantize_rows(x, 8, 32, kernels="compiled")
    ref = Q.quantize_rows(x, 8, 32, kernels="reference")
    assert torch.equal(q.data, ref.data) and not Q.compiled_available("quantize")
