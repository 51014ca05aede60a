"""Block quantization properties (single process, hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerotopo.comm.quant import (
    QMAX,
    codes,
    dequantize,
    pack_payload,
    payload_bytes,
    quantize_int4,
    quantize_int8,
    quantize_rows,
    unpack_payload,
)
from zerotopo.placement import volume

QUANTIZERS = {8: quantize_int8, 4: quantize_int4}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)


def _block_scales(x: torch.Tensor, q) -> torch.Tensor:
    """Each element's block scale."""
    return q.scales.repeat_interleave(q.block)[: x.numel()]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(finite, min_size=1, max_size=300),
    block=st.sampled_from([1, 2, 7, 16, 64]),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(list(DTYPES)),
)
def test_error_within_half_a_step(values, block, bits, dtype):
    x = torch.tensor(values, dtype=torch.float32).to(DTYPES[dtype])
    q = QUANTIZERS[bits](x, block)
    assert q.scales.dtype == torch.float32 and q.scales.numel() == math.ceil(x.numel() / block)
    assert payload_bytes(q) == (volume.int8_payload if bits == 8 else volume.int4_payload)(x.numel(), block)
    xf = x.float()
    scale = _block_scales(x, q)
    # Each scale is its block's absmax / qmax, computed from the values (never from reinterpreted bits).
    absmax = torch.nn.functional.pad(xf.abs(), (0, -x.numel() % block)).view(-1, block).amax(1)
    torch.testing.assert_close(q.scales, absmax / QMAX[bits], rtol=0, atol=0)
    x_hat = dequantize(q, out=torch.empty(x.numel(), dtype=torch.float32))
    err = (x_hat - xf).abs()
    # half a step, plus the fp32 rounding of code x scale itself (up to half an ulp of the result: at a
    # tie such as 3706 in a block whose absmax is 7412, 63.5 steps, that rounding alone passes 1e-6)
    ulp = x_hat.abs() * torch.finfo(torch.float32).eps
    assert torch.all(err <= scale / 2 * (1 + 1e-6) + ulp + 1e-30), (err - scale / 2).max()
    assert torch.all(codes(q).abs() <= QMAX[bits])
    # Back in the input's dtype: the bound plus that dtype's rounding of the result.
    back = dequantize(q)
    assert back.dtype == x.dtype and back.shape == x.shape
    eps = torch.finfo(x.dtype).eps
    assert torch.all((back.float() - xf).abs() <= scale / 2 * (1 + 1e-6) + x_hat.abs() * eps + 1e-30)


@settings(max_examples=40, deadline=None)
@given(
    value=finite,
    n=st.integers(1, 100),
    block=st.sampled_from([1, 8, 32]),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(["bf16", "fp16"]),
)
def test_constant_and_zero_blocks_exact(value, n, block, bits, dtype):
    dt = DTYPES[dtype]
    x = torch.full((n,), value).to(dt)
    q = QUANTIZERS[bits](x, block)
    c = codes(q).view(-1)
    if float(x[0]) == 0:
        assert torch.all(c == 0) and torch.all(q.scales == 0)
    else:
        assert torch.all(c == QMAX[bits] * int(math.copysign(1, float(x[0]))))
    assert torch.equal(dequantize(q), x)
    zero = torch.zeros(n, dtype=dt)
    assert torch.equal(dequantize(QUANTIZERS[bits](zero, block)), zero)


@pytest.mark.parametrize("bits", [8, 4])
def test_constant_fp32_block_codes_exact(bits):
    x = torch.tensor([0.3, -0.3, 0.3, 0.3, 1e-20, -1e-20, 7.0, 7.0], dtype=torch.float32)
    q = QUANTIZERS[bits](x, 2)
    qmax = QMAX[bits]
    assert codes(q).view(-1).tolist() == [qmax, -qmax, qmax, qmax, qmax, -qmax, qmax, qmax]
    # One fp32 rounding of qmax * scale at most.
    assert torch.allclose(dequantize(q), x, rtol=2 * torch.finfo(torch.float32).eps, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(finite, min_size=2, max_size=64),
    where=st.integers(0, 63),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(list(DTYPES)),
)
def test_nan_and_inf_propagate_to_their_block(values, where, bad, bits, dtype):
    block = 4
    x = torch.tensor(values, dtype=torch.float32)
    i = where % x.numel()
    x[i] = bad
    x = x.to(DTYPES[dtype])
    out = dequantize(QUANTIZERS[bits](x, block))
    b = i // block
    in_block = torch.zeros(x.numel(), dtype=torch.bool)
    in_block[b * block : (b + 1) * block] = True
    assert torch.all(torch.isnan(out[in_block])), "the block holding a non-finite value must be NaN"
    assert torch.all(torch.isfinite(out[~in_block])), "other blocks are unaffected"


def test_bf16_is_read_by_value_not_as_fp16_bits():
    # 1e30 exists in bf16 but not in fp16; reinterpreting bf16 bits as fp16 gives a different number.
    x = torch.tensor([1e30, -3e29, 2.5, 0.0], dtype=torch.bfloat16)
    q = quantize_int8(x, 4)
    assert q.scales[0].item() == pytest.approx(float(x[0]) / 127, rel=1e-6)
    assert torch.allclose(dequantize(q).float(), x.float(), rtol=0, atol=float(q.scales[0]) / 2 + 1e24)
    wrong = x.view(torch.float16).float()
    assert not torch.allclose(dequantize(q).float(), wrong, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(codes_list=st.lists(st.integers(-7, 7), min_size=1, max_size=101), rows=st.integers(1, 3))
def test_int4_packing_round_trip(codes_list, rows):
    # A leading 7 makes the block's scale exactly 1, so every code is stored as itself.
    row = [7, *codes_list]
    n = len(row)
    c = torch.tensor(row * rows, dtype=torch.float32).view(rows, -1)
    q = quantize_rows(c, 4, n)
    assert torch.equal(q.scales, torch.ones(rows, 1))
    assert q.data.dtype == torch.uint8 and q.data.shape == (rows, math.ceil(n / 2))
    assert torch.equal(codes(q).float(), c)
    # Packing layout: low nibble first, code + 8, an odd tail padded with code 0.
    arr = np.asarray(row) + 8
    if n % 2:
        arr = np.append(arr, 8)
    assert q.data[0].tolist() == (arr[0::2] | (arr[1::2] << 4)).tolist()
    # Wire format round trip.
    buf = pack_payload(q)
    assert buf.shape == (rows, volume.int4_payload(n, n))
    q2 = unpack_payload(buf, numel=q.numel, bits=4, block=n, dtype=q.dtype)
    assert torch.equal(dequantize(q2), c)


@pytest.mark.parametrize("bits", [8, 4])
def test_rows_quantize_independently(bits):
    x = torch.randn(3, 10)
    x[1] *= 1000
    q = quantize_rows(x, bits, 4)
    assert q.scales.shape == (3, 3)
    for r in range(3):
        qr = QUANTIZERS[bits](x[r], 4)
        assert torch.equal(q.scales[r], qr.scales)
        assert torch.equal(dequantize(q)[r], dequantize(qr))
    buf = pack_payload(q)
    q2 = unpack_payload(buf, numel=30, bits=bits, block=4, dtype=torch.float32)
    assert torch.equal(dequantize(q2), dequantize(q))


def test_bad_inputs():
    with pytest.raises(TypeError):
        quantize_int8(torch.arange(4), 2)
    with pytest.raises(ValueError):
        quantize_int4(torch.ones(4), 0)
