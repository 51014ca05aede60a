"""Every Triton quantization kernel compiles ahead of time for MI250X (gfx90a), MI300X (gfx942), A100
(sm_80) and H100 (sm_90) on this machine, with no register spills, and keeps the operations its
bit-exactness rests on ([Note: Triton kernels] in zerotopo/comm/triton_quant.py).

Each kernel is compiled once per target (a module fixture); about a minute on a small CPU.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install 'zerotopo[gpu]' or '.[test]')")

from zerotopo.comm import triton_aot as A  # noqa: E402

SPECS = A.kernel_specs()
#: The smallest shared memory per block (LDS per workgroup on gfx90a/gfx942; sm_80's default).
SHARED_LIMIT = 48 * 1024
FMA = re.compile(r"\b(v_fma\w*|v_fmac\w*|v_mac\w*|v_pk_fma\w*|fma\.rn\.f32)\b")


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, object]]:
    """target -> kernel name -> compiled kernel, built lazily, once."""
    cache: dict[str, dict[str, object]] = {}

    def get(target: str) -> dict[str, object]:
        if target not in cache:
            cache[target] = {s.name: A.compile_for(s, target) for s in SPECS}
        return cache[target]

    return get  # type: ignore[return-value]


def test_every_codec_kernel_is_built() -> None:
    names = {s.name for s in SPECS}
    for bits in (8, 4):
        for dtype in ("fp32", "bf16", "fp16"):
            assert {f"quantize_int{bits}_{dtype}", f"dequantize_int{bits}_{dtype}"} <= names
    assert "dequantize_reduce_int4" in names


@pytest.mark.parametrize("target", list(A.TARGETS))
def test_kernels_compile_without_spills(compiled, target: str) -> None:
    binary = "hsaco" if A.TARGETS[target][0] == "hip" else "cubin"
    report = []
    for name, kernel in compiled(target).items():
        assert kernel.asm.get(binary), f"{name}: no {binary} for {target}"
        res = A.resources(kernel)
        report.append(
            f"{name}: shared {res.shared_bytes} B, registers {res.registers}, spills {res.spill_bytes} B"
        )
        assert res.registers is not None and res.registers > 0, f"{name} on {target}: no register count"
        assert res.spill_bytes == 0, f"{name} on {target} spills registers: {res}"
        assert res.shared_bytes <= SHARED_LIMIT, f"{name} on {target}: {res.shared_bytes} B of shared memory"
    print(f"\n{target}:\n  " + "\n  ".join(report))


@pytest.mark.parametrize("target", list(A.TARGETS))
def test_compiled_code_keeps_the_references_rounding(compiled, target: str) -> None:
    """Round-half-even by the 1.5·2²³ add survives into the machine code (not folded away), divisions are
    IEEE-rounded, and no multiply-add is fused (the reference rounds products and sums separately).
    AMD has no division instruction: its IEEE division is an fma sequence ending in v_div_fixup, so the
    fma check there covers the kernels without a division."""
    amd = A.TARGETS[target][0] == "hip"
    for name, kernel in compiled(target).items():
        asm = kernel.asm["amdgcn"] if amd else kernel.asm["ptx"]
        quantizes = name.startswith("quantize")
        if not (amd and quantizes):
            fused = FMA.search(asm)
            assert fused is None, f"{name} on {target} fuses a multiply-add: {fused and fused.group(0)}"
        if quantizes:
            assert re.search(r"(v_add_f32\w*|add\.rn\.f32)\s.*\b0?[xf]4b400000\b", asm, re.I), name
            if amd:
                assert "v_div_fixup_f32" in asm and "v_rcp_f32" in asm, name
            else:
                assert "div.rn.f32" in asm and "div.approx" not in asm and "div.full" not in asm, name


def test_resources_parse_what_the_backends_report() -> None:
    amd = ".sgpr_count:     22\n    .sgpr_spill_count: 2\n    .vgpr_count:     11\n    .vgpr_spill_count: 1\n"
    assert A._amd_resources(amd, 16) == A.Resources(16, 33, 12)
    with pytest.raises(ValueError, match="metadata has no .vgpr_spill_count"):
        A._amd_resources(".sgpr_count: 1\n", 0)
    with pytest.raises(ValueError, match="unknown target 'sm_70'"):
        A.compile_for(SPECS[0], "sm_70")
