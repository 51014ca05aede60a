"""The GPU lane: the engine on a real accelerator (tests marked ``gpu``; skipped with the reason on CPU).

Run with ``pytest -m gpu tests/gpu``. Ranks share the machine's devices: with as many devices as ranks
each rank drives its own over NCCL (RCCL on ROCm); with fewer, several ranks share a device over gloo
with CUDA tensors (NCCL refuses two ranks on one device). The checks that must see the host's CUDA calls
(sync-debug mode, the stream sanitizer, timing) run over NCCL, on as many ranks as there are devices
(one rank on a one-device machine).

1. engine parity: every preset on CUDA matches the same ranks on CPU (1e-5 unquantized);
2. ``torch.cuda.set_sync_debug_mode("error")`` around steady-state steps of every preset raises nothing;
3. ``TORCH_CUDA_SANITIZER=1`` over steps with the secondary partition reports no unsynchronized access;
4. the race of Dai et al. on the device: the unordered hook with a delayed copy stream reads a stale
   secondary partition (the loss leaves the reference); ``event`` and ``host`` match it;
5. quantization kernels: compiled and reference bit-identical on the device and to the CPU reference,
   transient memory within the output size, throughput against the device's copy bandwidth;
6. event ordering at least as fast as the host block (timing);
7. the ledger's device timings resolve lazily.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.cases import MICRO, batch, loss_fn, make_model
from zerotopo.launch.spawn import spawn
from zerotopo.placement.plan import PRESETS

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QUANTIZED = {name for name, p in PRESETS.items() if p.quantize_weights or p.quantize_grads}
STEPS = 3


def _topology(world: int):
    """``world`` ranks: 2 nodes when the world is even and above 1 (so plans cross the network), else one."""
    from zerotopo.placement.topology import topology_from_mapping

    nodes = _nodes(world)
    return topology_from_mapping(
        {
            "name": f"gpu-lane-{world}",
            "nodes": nodes,
            "device": {"name": "accelerator", "memory_gib": 16, "peak_tflops": 100.0},
            "tiers": [{"name": "node", "fanout": world // nodes, "bandwidth_gbps": 100.0, "latency_us": 5}],
            "network": {"name": "network", "injection_gbps": 25.0, "latency_us": 10},
        }
    )


def _nodes(world: int) -> int:
    return 2 if world > 1 and world % 2 == 0 else 1


def _nccl_world(limit: int = 4) -> int:
    return max(1, min(torch.cuda.device_count(), limit))


def _spawn(fn: Any, world: int, *, backend: str, args: tuple = ()) -> list[Any]:
    """``world`` ranks as ``_topology(world)`` lays them out (emulated nodes for the start-up check)."""
    return spawn(fn, world, args=args, backend=backend, ranks_per_node=world // _nodes(world), timeout_s=560)


def _device(rank: int, kind: str) -> torch.device:
    if kind == "cpu":
        return torch.device("cpu")
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def _engine(case: dict[str, Any], rank: int, world: int, device: torch.device):
    from zerotopo.comm.ledger import Ledger
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset

    torch.backends.cuda.matmul.allow_tf32 = False
    plan = get_preset(case["plan"])
    if case.get("sync"):
        from dataclasses import replace

        plan = replace(plan, sync=case["sync"])
    mesh = build_mesh(_topology(world), plan, topo_index=rank, device=device)
    ledger = Ledger()
    model = debug.parallelize(
        make_model({}),
        mesh=mesh,
        mp_policy=MixedPrecision(case.get("param_dtype", torch.float32)),
        options=debug.DebugOptions(
            ledger=ledger,
            copy_delay_ms=case.get("copy_delay_ms", 0.0),
            unordered_secondary=case.get("unordered", False),
        ),
    )
    opt = ShardedOptimizer(model, lr=1e-2)
    return model, opt, ledger


def _batches(rank: int, steps: int, device: torch.device) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every micro-batch of every step, already on the device (no copy inside the timed steps)."""
    return [[tuple(t.to(device) for t in batch(s, rank, m)) for m in range(MICRO)] for s in range(steps)]


def _step(model: Any, opt: Any, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    total = None
    for k, (x, y) in enumerate(micro):
        loss = loss_fn(model(x), y) / MICRO
        # as zerotopo train runs it: the last backward starts the cross-replica reductions on their
        # own stream (and the step leaves the sharded units' parameter gathers in flight)
        model.set_is_last_backward(k == len(micro) - 1)
        model.scale_loss(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    opt.step()
    opt.zero_grad()
    return total


# -- 1. parity ---------------------------------------------------------------------------------------


def _parity_worker(rank: int, world: int, kind: str) -> dict[str, list[float]]:
    device = _device(rank, kind)
    out = {}
    for name in PRESETS:
        model, opt, _ = _engine({"plan": name}, rank, world, device)
        data = _batches(rank, STEPS, device)
        losses = torch.stack([_step(model, opt, data[s]) for s in range(STEPS)])
        out[name] = losses.tolist()  # read once, after the steps
        model.close()
    return out


def test_gpu_engine_parity_every_preset_cuda_vs_cpu() -> None:
    world = 4
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    cpu = _spawn(_parity_worker, world, args=("cpu",), backend="gloo")
    gpu = _spawn(_parity_worker, world, args=("cuda",), backend=backend)
    for rank in range(world):
        for name in PRESETS:
            a, b = torch.tensor(cpu[rank][name]), torch.tensor(gpu[rank][name])
            tol = 1e-2 if name in QUANTIZED else 1e-5
            err = ((a - b).abs() / a.abs()).max().item()
            assert err <= tol, f"{name} rank {rank} ({backend}): cpu {a.tolist()} cuda {b.tolist()}"


# -- 2. no host sync, 7. lazy ledger --------------------------------------------------------------------


def _sync_debug_worker(rank: int, world: int) -> dict[str, Any]:
    device = _device(rank, "cuda")
    cases = [{"plan": n} for n in PRESETS] + [{"plan": "zero3", "param_dtype": torch.float16, "name": "fp16"}]
    out: dict[str, Any] = {"errors": {}, "ledger": {}}
    for case in cases:
        name = case.get("name", case["plan"])
        model, opt, ledger = _engine(case, rank, world, device)
        data = _batches(rank, 4, device)
        for s in range(2):  # warm-up: unit order, NCCL communicators, index tensors, compiled kernels
            _step(model, opt, data[s])
            ledger.mark_step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for s in range(2, 4):
                _step(model, opt, data[s])
                ledger.mark_step()
        except RuntimeError as exc:
            out["errors"][name] = str(exc)[:500]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        ledger.poll()
        records = ledger.records()
        out["ledger"][name] = (len(records), sum(r.seconds for r in records), ledger.poll())
        model.close()
    return out


def test_gpu_sync_debug_mode_raises_nothing_in_steady_state_steps() -> None:
    results = _spawn(_sync_debug_worker, _nccl_world(), backend="nccl")
    for rank, res in enumerate(results):
        assert res["errors"] == {}, f"rank {rank}: {res['errors']}"


def test_gpu_ledger_times_resolve_lazily() -> None:
    results = _spawn(_sync_debug_worker, 1, backend="nccl")
    for name, (n, seconds, pending) in results[0]["ledger"].items():
        assert pending == 0, name
        if n:
            assert seconds > 0, name


# -- 3. stream sanitizer -------------------------------------------------------------------------------


def _csan_worker(rank: int, world: int) -> str:
    device = _device(rank, "cuda")
    for name in ("zerotopo", "zeropp"):  # int8 and bf16 secondary partitions
        model, opt, _ = _engine({"plan": name, "copy_delay_ms": 1.0}, rank, world, device)
        data = _batches(rank, STEPS, device)
        for s in range(STEPS):
            _step(model, opt, data[s])
        torch.cuda.synchronize()
        model.close()
    return "ok"


def csan_main() -> None:
    """Entry point of the sanitizer subprocess (``TORCH_CUDA_SANITIZER=1`` must be set before torch loads)."""
    print(_spawn(_csan_worker, _nccl_world(2), backend="nccl"))


def test_gpu_stream_sanitizer_reports_no_unsynchronized_access() -> None:
    env = {**os.environ, "TORCH_CUDA_SANITIZER": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.gpu.test_gpu_lane import csan_main; csan_main()"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    text = proc.stdout + proc.stderr
    first = text.find("CSAN detected")
    assert proc.returncode == 0 and first < 0, text[first : first + 6000] if first >= 0 else text[-4000:]


# -- 4. the race on the device, 6. event vs host timing ----------------------------------------------------


def _race_worker(rank: int, world: int, delay_ms: float) -> dict[str, Any]:
    device = _device(rank, "cuda")
    out: dict[str, Any] = {}
    cases = {
        "reference": {"plan": "zerotopo"},
        "unordered": {"plan": "zerotopo", "unordered": True, "copy_delay_ms": delay_ms},
        "event": {"plan": "zerotopo", "sync": "event", "copy_delay_ms": delay_ms},
        "host": {"plan": "zerotopo", "sync": "host", "copy_delay_ms": delay_ms},
    }
    for name, case in cases.items():
        model, opt, _ = _engine(case, rank, world, device)
        data = _batches(rank, STEPS + 3, device)
        losses = []
        times = []
        for s in range(STEPS + 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses.append(_step(model, opt, data[s]))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[name] = {"losses": torch.stack(losses).tolist(), "step_s": sorted(times[1:])[len(times[1:]) // 2]}
        model.close()
    return out


def test_gpu_race_reproduced_and_ordered_schedules_exact() -> None:
    # The race needs a secondary partition shared by two ranks or more: 4 ranks as 2 nodes of 2. On a
    # machine of fewer devices they share them over gloo, whose CUDA collectives read their input after
    # the stream they are called on (the all-gather stream), as NCCL does: the delayed copy stream is not
    # waited for unless the schedule orders it (one rank alone reads no secondary partition at all).
    world = 4
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    results = _spawn(_race_worker, world, args=(50.0,), backend=backend)
    for rank, res in enumerate(results):
        ref = torch.tensor(res["reference"]["losses"])
        for name in ("event", "host"):
            got = torch.tensor(res[name]["losses"])
            assert torch.allclose(got, ref, rtol=1e-6, atol=0), (rank, name, got.tolist(), ref.tolist())
        racy = torch.tensor(res["unordered"]["losses"])
        assert racy[0] == ref[0]  # the first forward reads no secondary partition
        # The backward read a partition the delayed copy had not written: the update and the loss leave the
        # reference (as Dai et al. saw it), whether or not the values turn non-finite.
        assert not torch.allclose(racy[1:], ref[1:], rtol=1e-4, atol=0), (racy.tolist(), ref.tolist())


def test_gpu_event_ordering_at_least_as_fast_as_host_block() -> None:
    results = _spawn(_race_worker, _nccl_world(2), args=(2.0,), backend="nccl")
    for rank, res in enumerate(results):
        event, host = res["event"]["step_s"], res["host"]["step_s"]
        print(
            f"rank {rank}: median step, copy delay 2 ms: event {event * 1e3:.2f} ms, host {host * 1e3:.2f} ms"
        )
        assert event <= host * 1.05, (event, host)


# -- 5. quantization kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_quantization_kernels_bit_identical(bits: int, dtype: torch.dtype) -> None:
    from zerotopo.comm import quant as Q

    g = torch.Generator().manual_seed(bits)
    x = (torch.randn(4, 10_007, generator=g) * 3).to(dtype)
    x[1, 17] = float("nan")
    x[2, 300] = float("inf")
    x[3, :256] = 0
    cpu = Q.quantize_rows(x, bits, 256, kernels="reference")
    for kernels in ("reference", "triton"):
        q = Q.quantize_rows(x.cuda(), bits, 256, kernels=kernels)
        assert torch.equal(q.data.cpu(), cpu.data), kernels
        assert torch.equal(q.scales.cpu().nan_to_num(-1.0), cpu.scales.nan_to_num(-1.0)), kernels
        back = Q.dequantize(q, kernels=kernels).cpu()
        ref = Q.dequantize(cpu, kernels="reference")
        assert torch.equal(back.nan_to_num(-1.0), ref.nan_to_num(-1.0)), kernels
        # into a bf16 buffer: the fp32 product rounded once to bf16 (not through the input's dtype)
        out = torch.empty(x.numel(), dtype=torch.bfloat16, device="cuda")
        Q.dequantize(q, out=out, kernels=kernels)
        ref32 = Q.dequantize(replace(cpu, dtype=torch.float32), kernels="reference")
        assert torch.equal(out.cpu().nan_to_num(-1.0), ref32.reshape(-1).to(torch.bfloat16).nan_to_num(-1.0))
    # Inductor (``compiled``) divides its own way on a GPU (measured on an H200: scales one rounding off
    # the true quotient, codes then one step off): within that, not bit-identical (docs/collectives.md).
    q = Q.quantize_rows(x.cuda(), bits, 256, kernels="compiled")
    assert Q.compiled_available("quantize")
    s_got, s_ref = q.scales.cpu(), cpu.scales
    assert torch.equal(s_got.isnan(), s_ref.isnan())
    finite = ~s_ref.isnan()
    assert ((s_got[finite] - s_ref[finite]).abs() <= s_ref[finite] * 2**-22).all()
    codes_got, codes_ref = Q.codes(q).cpu().int(), Q.codes(cpu).int()
    print(
        f"compiled int{bits} {dtype}: {(s_got[finite] != s_ref[finite]).sum().item()} of {finite.sum().item()} "
        f"scales and {(codes_got != codes_ref).sum().item()} of {codes_ref.numel()} codes differ from the CPU"
    )
    assert (codes_got - codes_ref).abs().max().item() <= 1


def test_gpu_quantization_fused_memory_and_bandwidth() -> None:
    """The kernels a device runs by default (Triton) allocate nothing beyond their output; every kernel
    set's bandwidth is printed beside the device's copy bandwidth (the goal, half of it, is a benchmark
    figure, not an assertion: ``python benchmarks/quant_bench.py``). ``compiled`` (Inductor) is printed
    too: its int4 quantize keeps a 2-byte temporary per value (measured on an H200)."""
    from benchmarks.quant_bench import bench_all, copy_bandwidth

    device = torch.device("cuda")
    peak = copy_bandwidth(device, 1 << 26)
    rows = bench_all(device, numel=1 << 26, dtype=torch.bfloat16, kernels=("reference", "compiled", "triton"))
    for r in rows:
        print(
            f"{r['op']} int{r['bits']} {r['kernels']}: {r['gb_s']:.0f} GB/s = {r['gb_s'] / peak:.0%} of "
            f"the copy bandwidth {peak:.0f} GB/s; transient {r['transient_bytes'] / 2**20:.1f} MiB "
            f"(output {r['output_bytes'] / 2**20:.1f} MiB)"
        )
    for r in rows:
        if r["kernels"] == "triton":
            assert r["transient_bytes"] <= r["output_bytes"], r
