"""bf16 on the wire, fp32 arithmetic: what :mod:`zerotopo_lab.bench.precision` promises each row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zerotopo_lab.bench import PRECISIONS, wire_bytes
from zerotopo_lab.bench.precision import DTYPES, Fp32Math, arithmetic


def test_bf16_products_are_fp32_products_rounded_once():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 96, generator=g).bfloat16()
    w = torch.randn(48, 96, generator=g).bfloat16()
    b = torch.randn(48, generator=g).bfloat16()
    with Fp32Math():
        y = F.linear(a, w, b)
        z = a @ w.t()
    assert y.dtype == z.dtype == torch.bfloat16
    assert torch.equal(y, F.linear(a.float(), w.float(), b.float()).bfloat16())
    assert torch.equal(z, (a.float() @ w.float().t()).bfloat16())


def test_the_loss_stays_fp32_and_gradients_reach_bf16_weights():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 8, generator=g).bfloat16().requires_grad_()
    x = torch.randn(4, 8, generator=g).bfloat16()
    y = torch.randint(0, 16, (4,), generator=g)
    with arithmetic("bf16"):
        loss = F.cross_entropy(F.linear(x, w), y)
    assert loss.dtype == torch.float32
    loss.backward()
    assert w.grad is not None and w.grad.dtype == torch.bfloat16
    ref = w.detach().float().requires_grad_()
    F.cross_entropy(F.linear(x.float(), ref).bfloat16().float(), y).backward()
    assert torch.allclose(w.grad.float(), ref.grad, rtol=2e-2, atol=1e-3)


def test_fp32_tensors_and_the_fp32_precision_are_left_alone():
    g = torch.Generator().manual_seed(2)
    a, w = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    with Fp32Math():
        inside = F.linear(a, w)
    with arithmetic("fp32"):
        plain = F.linear(a, w)
    assert torch.equal(inside, F.linear(a, w)) and torch.equal(plain, inside)


def test_widths_the_cost_model_prices():
    assert set(PRECISIONS) == set(DTYPES)
    assert wire_bytes("bf16") == {"param_bytes": 2, "reduce_bytes": 2, "grad_bytes": 4}
    assert wire_bytes("fp32") == {"param_bytes": 4, "reduce_bytes": 4, "grad_bytes": 4}
    assert all(DTYPES[k].itemsize == v for k, v in PRECISIONS.items())
