"""The benchmark's precision: bf16 on the wire, fp32 arithmetic (the CPU stand-in for bf16 tensor cores).

A GPU trains NeoX in bf16: weights are gathered and gradients reduced in 2 bytes per element, and the
matrix units multiply bf16 operands with fp32 accumulation at full speed. A CPU without AVX512-BF16 runs
bf16 matrix products about 40x slower than fp32 (measured on the 2-core benchmark VM: 44 GFLOPS fp32, 1.0
bf16, one thread, a 2048x384 @ 384x1536 product), which would turn a regime-matched run into a
compute-bound one. So under ``bf16`` every row keeps its model, collectives and gradients in bf16 as on
a GPU (each framework's own bf16 mode), and :class:`Fp32Math` performs the products, attention and norms
on fp32 copies of their bf16 operands and rounds their results back to bf16 (the loss stays fp32). The
step then costs what the fp32 step costs (0.59 s both, the ``wide`` model at vocabulary 256, 8 x 256
tokens, one thread), and the int8 and int4 codecs save 2x and 4x over plain transfers, as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from zerotopo.dtypes import PRECISIONS

DTYPES = {k: PRECISIONS[k] for k in ("fp32", "bf16")}
"""The torch dtype of each of :data:`zerotopo_lab.bench.PRECISIONS`."""

_ROUNDED = {
    F.linear,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    F.scaled_dot_product_attention,
    F.layer_norm,
}
"""Computed in fp32 and rounded to bf16, as a tensor core or a fused norm kernel accumulates."""
_FP32_OUT = {F.cross_entropy}
"""Computed in fp32 and left in fp32 (the loss)."""


def _up(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x


class Fp32Math(TorchFunctionMode):
    """Runs the products, attention, norms and the loss of bf16 tensors in fp32 (see the module
    docstring); every other operation, and every operation on other dtypes, as it is."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _ROUNDED or func in _FP32_OUT:
            values = list(args) + list(kwargs.values())
            if any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in values):
                out = func(*map(_up, args), **{k: _up(v) for k, v in kwargs.items()})
                return out.to(torch.bfloat16) if func in _ROUNDED else out
        return func(*args, **kwargs)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a :data:`DTYPES` name."""
    return DTYPES[name]


@contextlib.contextmanager
def arithmetic(name: str) -> Iterator[None]:
    """The context a row's step runs in: :class:`Fp32Math` for ``bf16``, nothing for ``fp32``."""
    if name == "bf16":
        with Fp32Math():
            yield
    else:
        yield
