"""The Triton quantization kernels: bit for bit the reference in Triton's interpreter, on CPU; the
engine's choice of kernels; the fallback to the reference where Triton is missing or cannot launch.

The interpreter must be selected before Triton is imported, so the comparisons run in one subprocess
(tests/comm/triton_interp_cases.py, ``TRITON_INTERPRET=1``); each case is its own test here. The kernels'
native runs on a device are in tests/gpu/test_triton_kernels.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from zerotopo.comm import quant as Q

pytestmark = pytest.mark.slow  # the interpreter runs every kernel case in a subprocess (tens of seconds)

pytest.importorskip("triton", reason="Triton is not installed (pip install 'zerotopo[gpu]' or '.[test]')")
pytest.importorskip("numpy", reason="Triton's interpreter needs numpy")

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    f"int{bits} block {block} {dtype} {shape}"
    for bits in (8, 4)
    for block, shape in ((2, "3x15"), (6, "4x61"), (256, "3x1000"), (5000, "2x9001"))
    for dtype in ("fp32", "bf16", "fp16")
] + ["nan-rule int8", "nan-rule int4"]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, list[str]]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/comm/triton_interp_cases.py")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_kernels_match_the_reference_bit_for_bit_in_the_interpreter(interpreted, case: str) -> None:
    """Codes and scales (quantize), values (dequantize, into a new tensor or a given one, to fp32, bf16
    and the input's type) and the int4 reduction's sums: ragged tails, zero, NaN, ±Inf, tie and denormal
    blocks, blocks of 2 to 5000 elements (over one tile: chunked)."""
    assert case in interpreted, sorted(interpreted)
    assert interpreted[case] == [], f"{case}: differs from the reference in {interpreted[case]}"


def test_every_case_ran(interpreted) -> None:
    assert sorted(interpreted) == sorted(CASES)


def test_devices_default_to_triton_and_cpu_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(Q.KERNELS_ENV, raising=False)
    assert Q.kernels_for(torch.device("cuda")) == "triton"  # ROCm's torch calls its devices cuda too
    assert Q.kernels_for(torch.device("cpu")) == "reference"
    monkeypatch.setenv(Q.KERNELS_ENV, "compiled")
    assert Q.kernels_for(torch.device("cuda")) == "compiled"
    monkeypatch.setenv(Q.KERNELS_ENV, "triton")
    assert Q.kernels_for(torch.device("cpu")) == "triton"


def test_without_triton_the_reference_runs_after_one_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def no_triton(name: str, *args, **kwargs):
        if name == "zerotopo.comm.triton_quant":
            raise ImportError("No module named 'triton'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_triton)
    monkeypatch.setattr(Q, "_compiled", {})
    x = torch.randn(2, 100)
    with pytest.warns(RuntimeWarning, match=r"Triton is not available .* reference quantization code runs"):
        q = Q.quantize_rows(x, 8, 32, kernels="triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not once per call
        back = Q.dequantize(q, kernels="triton")
        q4 = Q.quantize_rows(x, 4, 32, kernels="triton")
    ref = Q.quantize_rows(x, 8, 32, kernels="reference")
    assert torch.equal(q.data, ref.data) and torch.equal(back, Q.dequantize(ref))
    assert torch.equal(q4.data, Q.quantize_rows(x, 4, 32, kernels="reference").data)


def test_a_kernel_that_cannot_launch_falls_back_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the interpreter a CPU tensor cannot reach a Triton kernel: one warning, the reference's bits."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs the kernels on CPU tensors")
    monkeypatch.setattr(Q, "_compiled", {})
    x = torch.randn(3, 70)
    with pytest.warns(RuntimeWarning, match="Triton quantize kernel failed"):
        q = Q.quantize_rows(x, 4, 8, kernels="triton")
    assert torch.equal(q.data, Q.quantize_rows(x, 4, 8, kernels="reference").data)
    assert not Q.compiled_available("triton:quantize")


def test_the_reduction_adds_rows_in_position_order() -> None:
    """The reference fixes the order (Tensor.sum picks its own, which differs beyond a few rows): the
    Triton kernel adds in the same order, so the int4 reduce-scatter's sums are reproducible."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 300, generator=g) * torch.logspace(-4, 4, 24).unsqueeze(1)
    q = Q.quantize_rows(x, 4, 16, kernels="reference")
    rows = Q.dequantize(q).float()
    acc = rows[0].clone()
    for r in rows[1:]:
        acc = acc + r
    assert torch.equal(Q.dequantize_reduce(q), acc)


def test_an_odd_int4_block_takes_the_reference() -> None:
    from zerotopo.comm import triton_quant

    x = torch.randn(2, 30)
    assert not triton_quant.supports("quantize", x, 4, 15)
    assert triton_quant.supports("quantize", x, 8, 15) and triton_quant.supports("quantize", x, 4, 16)
