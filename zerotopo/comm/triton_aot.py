"""Ahead-of-time compilation of the quantizer's Triton kernels for GPUs this machine does not have.

``triton.compile(ASTSource(...), target=GPUTarget(...))`` runs Triton's whole pipeline for a named target
(AMD: LLVM to ``hsaco``; NVIDIA: ``ptxas`` to ``cubin``) without a device or a driver, so a kernel that
does not build for MI250X (gfx90a), MI300X (gfx942), A100 (sm_80) or H100 (sm_90) fails on any machine.
:func:`resources` reads what the backend reports about a compiled kernel: shared memory from Triton's
metadata; registers and spills from the AMD code object's metadata (``.vgpr_count``,
``.vgpr_spill_count``, ...) or, for NVIDIA, from ``cuobjdump --dump-resource-usage`` of the cubin (local
memory per thread is where ``ptxas`` spills registers).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from zerotopo.comm import triton_quant as K

#: The targets every kernel is built for: name -> (backend, arch, warp size).
TARGETS: dict[str, tuple[str, str | int, int]] = {
    "gfx90a": ("hip", "gfx90a", 64),  # AMD MI250X (Frontier)
    "gfx942": ("hip", "gfx942", 64),  # AMD MI300X
    "sm_80": ("cuda", 80, 32),  # NVIDIA A100
    "sm_90": ("cuda", 90, 32),  # NVIDIA H100
}
_PTR = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}
_INTS = ("rows", "n", "stride", "nblocks", "nbytes", "block")


@dataclass(frozen=True)
class KernelSpec:
    """One specialization of one kernel: its name, Triton signature and compile-time constants."""

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, int]


@dataclass(frozen=True)
class Resources:
    """What a backend reports about one compiled kernel (None where it reports nothing)."""

    shared_bytes: int
    registers: int | None
    spill_bytes: int | None


def kernel_specs(block: int = 256) -> list[KernelSpec]:
    """Every kernel the codecs launch, for fp32, bf16 and fp16 values and blocks of ``block``."""
    specs = []
    for bits in (8, 4):
        per, chunk = K._geometry(block)
        chunk = chunk // 2 if bits == 4 else chunk
        codes = "*i8" if bits == 8 else "*u8"
        for dtype, ptr in _PTR.items():
            sig = {"x_ptr": ptr, "data_ptr": codes, "scale_ptr": "*fp32", **dict.fromkeys(_INTS, "i32")}
            consts = {"BITS": bits, "BLOCKS": per, "CHUNK": chunk}
            specs.append(KernelSpec(f"quantize_int{bits}_{dtype}", K._quantize_kernel, sig, consts))
            sig = {"data_ptr": codes, "scale_ptr": "*fp32", "out_ptr": ptr}
            sig |= dict.fromkeys(("rows", "n", "nblocks", "nbytes", "block"), "i32")
            consts = {"BITS": bits, "ELEMS": K.ELEMENTS}
            specs.append(KernelSpec(f"dequantize_int{bits}_{dtype}", K._dequantize_kernel, sig, consts))
    sig = {"data_ptr": "*u8", "scale_ptr": "*fp32", "out_ptr": "*fp32"}
    sig |= dict.fromkeys(("rows", "n", "nblocks", "nbytes", "block"), "i32")
    specs.append(
        KernelSpec(
            "dequantize_reduce_int4", K._dequantize_reduce_kernel, sig, {"BITS": 4, "ELEMS": K.ELEMENTS}
        )
    )
    return specs


def compile_for(spec: KernelSpec, target: str) -> Any:
    """The compiled kernel of ``spec`` for ``target`` (a key of :data:`TARGETS`), with the launch options
    the runtime uses (no fp fusion, :data:`~zerotopo.comm.triton_quant.NUM_WARPS` warps)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    src = ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs)
    options = {"num_warps": K.NUM_WARPS, "enable_fp_fusion": False}
    return triton.compile(src, target=GPUTarget(*TARGETS[target]), options=options)


def resources(kernel: Any) -> Resources:
    """Shared memory, registers and spilled bytes of a compiled kernel, as its backend reports them."""
    shared = int(kernel.metadata.shared)
    if "amdgcn" in kernel.asm:
        return _amd_resources(kernel.asm["amdgcn"], shared)
    if "cubin" in kernel.asm:
        return _cuda_resources(kernel.asm["cubin"], shared)
    return Resources(shared, None, None)


def _amd_resources(asm: str, shared: int) -> Resources:
    def field(key: str) -> int:
        m = re.search(rf"\.{key}:\s+(\d+)", asm)
        if m is None:
            raise ValueError(f"the AMD code object's metadata has no .{key}")
        return int(m.group(1))

    # a spilled VGPR or SGPR costs 4 bytes of scratch memory per lane
    spills = 4 * (field("vgpr_spill_count") + field("sgpr_spill_count"))
    return Resources(shared, field("vgpr_count") + field("sgpr_count"), spills)


def _cuda_resources(cubin: bytes, shared: int) -> Resources:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        tool = triton.knobs.nvidia.cuobjdump.path
        out = subprocess.run(
            [tool, "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True
        )
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out.stdout)
    if m is None:
        raise ValueError(f"cuobjdump reported no resource usage: {out.stdout[:200]!r}")
    return Resources(shared, int(m.group(1)), int(m.group(2)) + int(m.group(3)))
